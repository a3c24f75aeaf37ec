#include "kernels/backend.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#ifdef PS_HAVE_CUDA
#include "kernels/cuda_backend.h"
#endif

namespace ps {

absl::StatusOr<DeviceRequest> ParseDevice(const std::string& device) {
  DeviceRequest request;
  if (device == "cpu") {
    request.kind = DeviceRequest::kCpu;
  } else if (device == "auto") {
    request.kind = DeviceRequest::kAuto;
  } else if (device == "cuda") {
    request.kind = DeviceRequest::kCuda;
  } else if (device.rfind("cuda:", 0) == 0 && absl::SimpleAtoi(device.substr(5), &request.index) &&
             request.index >= 0) {
    request.kind = DeviceRequest::kCuda;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown --device '", device, "': expected auto, cpu, cuda or cuda:N"));
  }
  return request;
}

int LocalRank(int rank) {
  const char* local = std::getenv("LOCAL_RANK");
  int value = 0;
  if (local != nullptr && absl::SimpleAtoi(local, &value) && value >= 0) return value;
  return rank;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device, int cpu_threads,
                                                     int rank) {
  absl::StatusOr<DeviceRequest> request = ParseDevice(device);
  if (!request.ok()) return request.status();
  if (request->kind == DeviceRequest::kCpu) return MakeCpuBackend(cpu_threads);
#ifdef PS_HAVE_CUDA
  // A typo in the CUDA settings is an error, not a reason to fall back to a slower CPU.
  if (absl::Status settings = CheckCudaSettings(); !settings.ok()) return settings;
  absl::StatusOr<int> count = CudaDeviceCount();
  // Without an index, the process's GPU is its local rank modulo the host's GPUs.
  auto pick = [&] { return request->index >= 0 ? request->index : LocalRank(rank) % *count; };
  if (request->kind == DeviceRequest::kCuda) {
    if (!count.ok()) return count.status();
    return MakeCudaBackend(*count > 0 ? pick() : 0);  // with no GPU, says so
  }
  if (!count.ok()) {
    PS_LOG(WARNING) << "--device=auto: " << count.status().message() << "; using the CPU backend";
    return MakeCpuBackend(cpu_threads);
  }
  if (*count == 0) {
    PS_LOG(INFO) << "--device=auto: no GPU found, using the CPU backend";
    return MakeCpuBackend(cpu_threads);
  }
  absl::StatusOr<std::unique_ptr<Backend>> gpu = MakeCudaBackend(pick());
  if (gpu.ok()) return gpu;
  PS_LOG(WARNING) << "--device=auto: a GPU is present but the CUDA backend could not start ("
                  << gpu.status().message() << "); using the CPU backend";
#else
  if (request->kind == DeviceRequest::kCuda) {
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
