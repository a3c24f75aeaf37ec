#include "kernels/backend.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#ifdef PS_HAVE_CUDA
#include "kernels/cuda_backend.h"
#endif

namespace ps {

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device, int cpu_threads) {
  if (device == "cpu") return MakeCpuBackend(cpu_threads);
  int index = 0;
  bool cuda = device == "cuda" || (device.rfind("cuda:", 0) == 0 &&
                                   absl::SimpleAtoi(device.substr(5), &index) && index >= 0);
  if (!cuda && device != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown --device '", device, "': expected auto, cpu, cuda or cuda:N"));
  }
#ifdef PS_HAVE_CUDA
  if (cuda) return MakeCudaBackend(index);
  if (CudaDeviceCount() > 0) return MakeCudaBackend(0);
  PS_LOG(INFO) << "--device=auto: no usable GPU found, using the CPU backend";
#else
  if (cuda) {
    return absl::FailedPreconditionError(
        "--device=" + device +
        " asked for CUDA, but this build has no CUDA backend (nvcc was not "
        "found at configure time)");
  }
  PS_LOG(INFO) << "--device=auto: built without CUDA, using the CPU backend";
#endif
  return MakeCpuBackend(cpu_threads);
}

}  // namespace ps
