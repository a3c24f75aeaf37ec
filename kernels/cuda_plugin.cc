// The CUDA plugin's one exported symbol (see cuda_plugin.h); everything else in it is hidden.
#include "kernels/cuda_plugin.h"

#include "kernels/cuda_backend.h"

extern "C" __attribute__((visibility("default"))) const ps::CudaPlugin* ps_cuda_plugin_v1() {
  static const ps::CudaPlugin plugin = {&ps::SetLogSink, &ps::CheckCudaSettings,
                                        &ps::CudaDeviceCount, &ps::MakeCudaBackend};
  return &plugin;
}
