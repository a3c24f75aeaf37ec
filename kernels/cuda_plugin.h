// The CUDA backend as a plugin (libparamserver_cuda.so, beside the programs): MakeBackend loads it
// with dlopen only when a GPU is asked for, so that only the plugin needs cuBLAS and the CUDA
// runtime, and the programs start on machines without them. The plugin exports one C function,
// kCudaPluginEntry, which returns the table below; the plugin and its loader come from one build
// (the entry's name carries the table's version, so that a stale plugin fails to load instead of
// crashing).
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/log.h"
#include "kernels/backend.h"

namespace ps {

// The functions of kernels/cuda_backend.h, as the plugin's copy of them.
struct CudaPlugin {
  // Where the plugin's own copy of the logger writes: the loader passes a sink into its own, so
  // that the plugin's lines carry the program's tag and reach its sink.
  void (*set_log_sink)(LogSink sink);
  absl::Status (*check_settings)();
  absl::StatusOr<int> (*device_count)();
  absl::StatusOr<std::unique_ptr<Backend>> (*make_backend)(int device);
};

// The exported function: extern "C" const CudaPlugin* ps_cuda_plugin_v1(), never null.
inline constexpr char kCudaPluginEntry[] = "ps_cuda_plugin_v1";

}  // namespace ps
