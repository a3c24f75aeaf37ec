// The compute backend: the few kernels an MLP or a small CNN needs, on the host (CPU + BLAS) or on
// a GPU (CUDA + cuBLAS). Pointers passed to the kernels live in the backend's memory (Allocate);
// all matrices are row-major. A backend is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ps {

class Backend {
 public:
  // A recording of queued work that the backend can replay (a CUDA graph); see RunRecorded.
  class Recording {
   public:
    virtual ~Recording() = default;
  };

  // What SoftmaxCrossEntropy leaves in backend memory about a minibatch.
  struct LossSummary {
    double loss_sum = 0;         // cross-entropy summed over the rows whose label is valid
    int64_t hits = 0;            // rows whose argmax (the first index of the maximum) is the label
    int32_t first_bad_row = -1;  // the first row whose label is outside [0, cols); -1 if none
  };

  virtual ~Backend() = default;
  virtual std::string Name() const = 0;

  // Backend memory. Allocate never returns null (it aborts on exhaustion, like operator new).
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
  // Host memory that the backend copies from and to fastest: page-locked for CUDA (full-speed
  // DMA, and copies that do not block the host), ordinary aligned memory for the CPU. Never null
  // (aborts on exhaustion).
  virtual void* AllocateHost(size_t bytes) = 0;
  virtual void FreeHost(void* p) = 0;

  // Work is queued: kernels and the Async copies run in the order they were called, and may still
  // be running when the call returns (on a GPU). Synchronize waits until all of it has run; a
  // host buffer given to an Async copy must stay valid and unchanged until then.
  virtual void CopyToDeviceAsync(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void CopyToHostAsync(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void Synchronize() = 0;
  // Copies that have finished when they return (and wait for everything queued before them).
  void CopyToDevice(void* dst, const void* host_src, size_t bytes) {
    CopyToDeviceAsync(dst, host_src, bytes);
    Synchronize();
  }
  void CopyToHost(void* host_dst, const void* src, size_t bytes) {
    CopyToHostAsync(host_dst, src, bytes);
    Synchronize();
  }

  // Queues what `queue_work` queues. The CUDA backend, the first time it is given an empty
  // *recording, records that work into a CUDA graph kept in *recording (one launch instead of
  // one per kernel) and from then on replays the graph without calling queue_work. So queue_work
  // must queue the same kernels on the same pointers and sizes every time one *recording is
  // passed, and may only queue kernels (no Allocate, Free, copy or Synchronize). The CPU backend,
  // CUDA with PS_CUDA_GRAPHS=0, or CUDA after a recording could not be made (logged once) calls
  // queue_work every time and leaves *recording empty.
  // A recording must be destroyed before its backend.
  virtual void RunRecorded(std::unique_ptr<Recording>* recording,
                           absl::FunctionRef<void()> queue_work) = 0;

  // dst row r = src row index[r], for r < rows, rows of row_bytes bytes; src, index and dst in
  // backend memory. Lets a worker keep its whole data shard on the device and send only indices.
  // REQUIRES: row_bytes % 4 == 0; every index within src.
  virtual void GatherRows(const void* src, const int32_t* index, int rows, size_t row_bytes,
                          void* dst) = 0;

  // C[m,n] = alpha * op(A) * op(B) + beta * C, where op(A) is [m,k] and op(B) is [k,n].
  virtual void Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                    const float* a, const float* b, float beta, float* c) = 0;
  // z[r,c] += bias[c]; then z = max(z, 0) if relu.
  virtual void AddBiasActivate(float* z, const float* bias, int rows, int cols, bool relu) = 0;
  // dz[i] = 0 where activation[i] <= 0 (the ReLU's derivative, from its output).
  virtual void ReluBackward(float* dz, const float* activation, int64_t n) = 0;
  // out[c] = sum over rows of x[r,c].
  virtual void ColumnSum(const float* x, int rows, int cols, float* out) = 0;
  // Softmax cross-entropy of `logits` [rows, cols] against int32 `labels`, summarised into
  // *summary (backend memory; deterministic: the same inputs give the same bits). If dlogits is
  // not null, writes d(mean loss)/d(logits) there (it may alias logits); a row with an invalid
  // label gets the softmax's probabilities / rows.
  virtual void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int cols,
                                   float* dlogits, LossSummary* summary) = 0;

  // Convolutions, as im2col + Gemm. Images are NHWC: `batch` images of height x width x
  // channels, row-major, channels fastest. A kernel x kernel window moves by `stride` over the
  // image padded with `pad` zeros on each side.
  struct ConvShape {
    int batch = 0, height = 0, width = 0, channels = 0, kernel = 1, stride = 1, pad = 0;
    int out_height() const { return (height + 2 * pad - kernel) / stride + 1; }
    int out_width() const { return (width + 2 * pad - kernel) / stride + 1; }
    int64_t rows() const { return static_cast<int64_t>(batch) * out_height() * out_width(); }
    int64_t cols() const { return static_cast<int64_t>(kernel) * kernel * channels; }
  };
  // cols [s.rows(), s.cols()]: row (n, oy, ox) holds the window at output pixel (oy, ox) of
  // image n, ordered (ky, kx, c): x[n, oy*stride - pad + ky, ox*stride - pad + kx, c], 0 in the
  // padding. cols x weight [kernel*kernel*channels, out_channels] is then the convolution's
  // output, NHWC [batch, out_height, out_width, out_channels].
  virtual void Im2Col(const float* x, const ConvShape& s, float* cols) = 0;
  // The adjoint of Im2Col: dx [batch, height, width, channels] (overwritten) = the sum of every
  // cols entry copied from that pixel. Deterministic.
  virtual void Col2Im(const float* cols, const ConvShape& s, float* dx) = 0;
  // Max-pooling of NHWC x over window x window tiles (stride = window, no padding; a partial
  // tile at the edge is dropped): y [batch, height/window, width/window, channels], and
  // argmax[i] = the index into x of y[i] (the first maximum of its tile).
  virtual void MaxPool(const float* x, int batch, int height, int width, int channels, int window,
                       float* y, int32_t* argmax) = 0;
  // dx [x_size] (overwritten) = 0 but dx[argmax[i]] = dy[i] for i < n (tiles do not overlap).
  virtual void MaxPoolBackward(const float* dy, const int32_t* argmax, int64_t n, int64_t x_size,
                               float* dx) = 0;
};

// The CPU backend (OpenBLAS), using `threads` BLAS threads.
std::unique_ptr<Backend> MakeCpuBackend(int threads);

// What --device asks for: "cpu", "auto" (a GPU if one is usable, else the CPU), "cuda" (a GPU
// chosen by local rank) or "cuda:N" (GPU N).
struct DeviceRequest {
  enum Kind { kCpu, kAuto, kCuda } kind = kCpu;
  int index = -1;  // N of cuda:N; -1: chosen by local rank
};
absl::StatusOr<DeviceRequest> ParseDevice(const std::string& device);

// The process's rank among those on its host: $LOCAL_RANK where set (torchrun, many launchers),
// else `rank`.
int LocalRank(int rank);

// The backend named by --device (see DeviceRequest). "auto" and "cuda" take GPU
// LocalRank(rank) mod the number of GPUs, so the workers of a multi-GPU host spread over its
// GPUs. The CUDA backend is a plugin (kernels/cuda_plugin.h) that lies beside the program or
// shared library this code is linked into, loaded on the first request for a GPU. "auto" falls
// back to the CPU, saying why in the log, when the plugin cannot be loaded (not built or
// installed; cuBLAS missing), when there is no GPU, when the driver is too old, or when a GPU is
// there but the CUDA backend cannot start on it (out of memory, exclusive-process mode taken by
// another process, ...). "cuda" and "cuda:N" fail with the reason instead. Once the plugin is
// loaded, a bad PS_CUDA_MATH or PS_CUDA_GRAPHS is an error for all three.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device, int cpu_threads,
                                                     int rank = 0);

// An owning, typed buffer in a backend's memory.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend* backend, size_t count)
      : backend_(backend),
        data_(static_cast<T*>(backend->Allocate(count * sizeof(T)))),
        count_(count) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(backend_, o.backend_);
    std::swap(data_, o.data_);
    std::swap(count_, o.count_);
    return *this;
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) backend_->Free(data_);
  }
  T* data() const { return data_; }
  size_t size() const { return count_; }
  void Upload(const T* host, size_t count) {
    backend_->CopyToDevice(data_, host, count * sizeof(T));
  }
  void Download(T* host, size_t count) const {
    backend_->CopyToHost(host, data_, count * sizeof(T));
  }
  // Queued copies of `count` elements from the buffer's element `offset` on: `host` must stay
  // valid and unchanged until the backend's Synchronize().
  void UploadAsync(const T* host, size_t count, size_t offset = 0) {
    backend_->CopyToDeviceAsync(data_ + offset, host, count * sizeof(T));
  }
  void DownloadAsync(T* host, size_t count, size_t offset = 0) const {
    backend_->CopyToHostAsync(host, data_ + offset, count * sizeof(T));
  }

 private:
  Backend* backend_ = nullptr;
  T* data_ = nullptr;
  size_t count_ = 0;
};

// An owning, typed buffer of the backend's preferred host memory (see AllocateHost).
template <typename T>
class HostBuffer {
 public:
  HostBuffer(Backend* backend, size_t count)
      : backend_(backend),
        data_(static_cast<T*>(backend->AllocateHost(count * sizeof(T)))),
        count_(count) {}
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { backend_->FreeHost(data_); }
  T* data() const { return data_; }
  size_t size() const { return count_; }
  absl::Span<T> span() const { return absl::Span<T>(data_, count_); }

 private:
  Backend* backend_;
  T* data_;
  size_t count_;
};

}  // namespace ps
