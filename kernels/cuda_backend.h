// The CUDA backend (cuBLAS GEMMs plus own kernels), built only when nvcc is found.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace ps {

// Number of usable CUDA devices; 0 when there is no GPU or no driver (never an error).
int CudaDeviceCount();

// A backend on GPU `device`. Fails with a message saying why (no driver, no such device, cuBLAS
// could not start) instead of aborting.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device);

}  // namespace ps
