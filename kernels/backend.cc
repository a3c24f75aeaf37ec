#include "kernels/backend.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#ifdef PS_HAVE_CUDA
#include <dlfcn.h>
#include <link.h>

#include <filesystem>

#include "kernels/cuda_plugin.h"
#endif

namespace ps {
#ifdef PS_HAVE_CUDA
namespace {

// The directory of the program or shared library that this code is linked into.
std::filesystem::path OwnDirectory() {
  Dl_info info;
  link_map* map = nullptr;
  std::filesystem::path path = "/proc/self/exe";  // the main program's l_name is empty
  if (dladdr1(reinterpret_cast<void*>(&OwnDirectory), &info, reinterpret_cast<void**>(&map),
              RTLD_DL_LINKMAP) != 0 &&
      map != nullptr && map->l_name[0] != '\0') {
    path = map->l_name;
  }
  std::error_code error;
  std::filesystem::path resolved = std::filesystem::canonical(path, error);
  return (error ? path : resolved).parent_path();
}

absl::StatusOr<const CudaPlugin*> OpenCudaPlugin() {
  const std::string path = (OwnDirectory() / PS_CUDA_PLUGIN).string();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  void* entry = handle != nullptr ? dlsym(handle, kCudaPluginEntry) : nullptr;
  if (entry == nullptr) {
    const char* why = dlerror();
    const std::string fix =
        std::filesystem::exists(path)
            ? absl::StrCat("install the CUDA ", PS_CUDA_MAJOR, " toolkit's cuBLAS (libcublas.so.",
                           PS_CUDA_MAJOR, ") where the loader finds it (ldconfig or LD_LIBRARY_PATH)")
            : "this installation has no CUDA backend (it is built when nvcc is found)";
    return absl::FailedPreconditionError(absl::StrCat("cannot load the CUDA backend ", path, ": ",
                                                      why != nullptr ? why : "", "; ", fix));
  }
  const CudaPlugin* plugin = reinterpret_cast<const CudaPlugin* (*)()>(entry)();
  plugin->set_log_sink(
      [](LogLevel level, const std::string& message) { LogMessage(level).stream() << message; });
  return plugin;
}

// Loaded once, on first use, and never unloaded: its backends' code lives there.
const absl::StatusOr<const CudaPlugin*>& CudaPluginOnce() {
  static const auto* plugin = new absl::StatusOr<const CudaPlugin*>(OpenCudaPlugin());
  return *plugin;
}

// Whether the NVIDIA driver's library is installed (a GPU may be there).
bool HaveNvidiaDriver() { return dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL) != nullptr; }

}  // namespace
#endif

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
  const absl::StatusOr<const CudaPlugin*>& cuda = CudaPluginOnce();
  if (!cuda.ok()) {
    if (request->kind == DeviceRequest::kCuda) {
      return absl::FailedPreconditionError(absl::StrCat("--device=", device, ": ",
                                                        cuda.status().message()));
    }
    LogMessage(HaveNvidiaDriver() ? LogLevel::kWARNING : LogLevel::kINFO).stream()
        << "--device=auto: " << cuda.status().message() << "; using the CPU backend";
    return MakeCpuBackend(cpu_threads);
  }
  // A typo in the CUDA settings is an error, not a reason to fall back to a slower CPU.
  if (absl::Status settings = (*cuda)->check_settings(); !settings.ok()) return settings;
  absl::StatusOr<int> count = (*cuda)->device_count();
  // Without an index, the process's GPU is its local rank modulo the host's GPUs.
  auto pick = [&] { return request->index >= 0 ? request->index : LocalRank(rank) % *count; };
  if (request->kind == DeviceRequest::kCuda) {
    if (!count.ok()) return count.status();
    return (*cuda)->make_backend(*count > 0 ? pick() : 0);  // with no GPU, says so
  }
  if (!count.ok()) {
    PS_LOG(WARNING) << "--device=auto: " << count.status().message() << "; using the CPU backend";
    return MakeCpuBackend(cpu_threads);
  }
  if (*count == 0) {
    PS_LOG(INFO) << "--device=auto: no GPU found, using the CPU backend";
    return MakeCpuBackend(cpu_threads);
  }
  absl::StatusOr<std::unique_ptr<Backend>> gpu = (*cuda)->make_backend(pick());
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
