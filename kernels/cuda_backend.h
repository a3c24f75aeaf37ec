// The CUDA backend (cuBLAS GEMMs plus own kernels), built only when nvcc is found.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace ps {

// Whether PS_CUDA_MATH and PS_CUDA_GRAPHS (see MakeCudaBackend) hold valid values:
// INVALID_ARGUMENT naming the variable otherwise. Needs no GPU.
absl::Status CheckCudaSettings();

// Number of CUDA devices: 0 when there is no GPU or no NVIDIA driver; an error saying why when a
// GPU may be there but cannot be used (a driver too old for this build's CUDA runtime, ...).
absl::StatusOr<int> CudaDeviceCount();

// A backend on GPU `device`. Fails with a message saying why (no driver, no such device, out of
// memory, cuBLAS could not start, a bad PS_CUDA_MATH or PS_CUDA_GRAPHS) instead of aborting.
// Environment: PS_CUDA_MATH = fp32 (default) | tf32 | bf16, how cuBLAS computes the GEMMs;
// PS_CUDA_GRAPHS = 1 (default) | 0, whether RunRecorded records CUDA graphs.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device);

}  // namespace ps
