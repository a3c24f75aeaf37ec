// The compute backend: the few dense kernels an MLP needs, on the host (CPU + BLAS) or on a GPU
// (CUDA + cuBLAS). Pointers passed to the kernels live in the backend's memory (Allocate); all
// matrices are row-major. A backend is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ps {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string Name() const = 0;

  // Backend memory. Allocate never returns null (it aborts on exhaustion, like operator new).
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
  virtual void CopyToDevice(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void CopyToHost(void* host_dst, const void* src, size_t bytes) = 0;
  // Host memory that the backend copies from and to fastest: page-locked for CUDA (full-speed
  // DMA), ordinary aligned memory for the CPU. Never null (aborts on exhaustion).
  virtual void* AllocateHost(size_t bytes) = 0;
  virtual void FreeHost(void* p) = 0;

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
  // Mean softmax cross-entropy of `logits` [rows, cols] against int32 `labels`. If dlogits is not
  // null, writes d(mean loss)/d(logits) there. *correct gets the number of argmax hits.
  virtual float SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int cols,
                                    float* dlogits, int64_t* correct) = 0;
};

// The CPU backend (OpenBLAS), using `threads` BLAS threads.
std::unique_ptr<Backend> MakeCpuBackend(int threads);

// The backend named by --device: "cpu", "cuda", "cuda:N" or "auto" (a GPU if one is usable,
// otherwise the CPU, saying so in the log). Fails with a clear message when CUDA was asked for and
// this build or machine has none.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device, int cpu_threads);

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
