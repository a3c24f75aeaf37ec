// CUDA backend: GEMM through cuBLAS, the other kernels written here. Semantics match cpu_backend.cc
// (row-major matrices, mean softmax cross-entropy, argmax = first index of the maximum).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "kernels/backend.h"
#include "kernels/cuda_backend.h"

namespace ps {
namespace {

constexpr int kThreads = 256;  // threads per block for the elementwise kernels and column sums
constexpr int kWarp = 32;
constexpr int kSoftmaxThreads = 1024;  // softmax: one block, a warp per row in turn
constexpr int kSoftmaxWarps = kSoftmaxThreads / kWarp;
constexpr int kColumnTile = 32;  // column sum: 32 columns x 8 row groups per block
constexpr int kRowGroups = kThreads / kColumnTile;
constexpr size_t kCublasWorkspaceBytes = 32 << 20;  // what NVIDIA advises for Hopper

// How cuBLAS may compute the float GEMMs, chosen by PS_CUDA_MATH.
enum class GemmMath { kFp32, kTf32, kBf16 };

const char* GemmMathName(GemmMath math) {
  switch (math) {
    case GemmMath::kFp32:
      return "fp32";
    case GemmMath::kTf32:
      return "tf32";
    case GemmMath::kBf16:
      return "bf16";
  }
  return "?";
}

absl::StatusOr<GemmMath> GemmMathFromEnv() {
  const char* value = std::getenv("PS_CUDA_MATH");
  if (value == nullptr || *value == '\0' || std::string(value) == "fp32") return GemmMath::kFp32;
  if (std::string(value) == "tf32") return GemmMath::kTf32;
  if (std::string(value) == "bf16") return GemmMath::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat("PS_CUDA_MATH='", value, "': expected fp32 (the default), tf32 or bf16"));
}

absl::StatusOr<bool> GraphsFromEnv() {
  const char* value = std::getenv("PS_CUDA_GRAPHS");
  if (value == nullptr || *value == '\0' || std::string(value) == "1") return true;
  if (std::string(value) == "0") return false;
  return absl::InvalidArgumentError(
      absl::StrCat("PS_CUDA_GRAPHS='", value, "': expected 1 (the default) or 0"));
}

std::string CudaErrorText(cudaError_t e) {
  return absl::StrCat(cudaGetErrorString(e), " (", cudaGetErrorName(e), ")");
}

// After construction a failed CUDA or cuBLAS call means a bug, a bad pointer or a lost GPU, and the
// Backend interface has no error path: log what failed and abort.
void CheckCuda(cudaError_t e, const char* expr, const char* file, int line) {
  if (e == cudaSuccess) return;
  PS_LOG(ERROR) << file << ":" << line << ": " << expr << " failed: " << CudaErrorText(e);
  std::abort();
}

void CheckCublas(cublasStatus_t s, const char* expr, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  PS_LOG(ERROR) << file << ":" << line << ": " << expr << " failed: " << cublasGetStatusString(s);
  std::abort();
}

#define PS_CUDA_CHECK(expr) CheckCuda((expr), #expr, __FILE__, __LINE__)
#define PS_CUBLAS_CHECK(expr) CheckCublas((expr), #expr, __FILE__, __LINE__)
// Catches launch-configuration errors at once; faults inside a kernel surface at the next sync.
#define PS_CUDA_CHECK_LAUNCH() PS_CUDA_CHECK(cudaGetLastError())

// ---- Kernels ----

// The elementwise kernels take their index type as a parameter: int32_t where the element count
// fits (the common case: 32-bit division and remainder are several times cheaper), else int64_t.
template <typename Index>
__global__ void AddBiasActivateKernel(float* z, const float* __restrict__ bias, Index n, Index cols,
                                      bool relu) {
  for (Index i = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    float v = z[i] + bias[i % cols];
    // Written as std::max(v, 0.0f) evaluates, so NaN and -0.0 come out as on the CPU.
    z[i] = relu ? (v < 0.0f ? 0.0f : v) : v;
  }
}

// 4-byte words: word w of row r comes from word w of row index[r].
// (The source offset is 64-bit: the whole data shard may exceed 2^31 words.)
template <typename Index>
__global__ void GatherRowsKernel(const uint32_t* __restrict__ src,
                                 const int32_t* __restrict__ index, Index n, Index words_per_row,
                                 uint32_t* __restrict__ dst) {
  for (Index i = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index r = i / words_per_row;
    dst[i] = src[static_cast<int64_t>(index[r]) * words_per_row + (i - r * words_per_row)];
  }
}

template <typename Index>
__global__ void ReluBackwardKernel(float* dz, const float* __restrict__ activation, Index n) {
  for (Index i = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    if (!(activation[i] > 0.0f)) dz[i] = 0.0f;
  }
}

// Convolution geometry as the kernels use it (Backend::ConvShape with its outputs computed).
struct ConvGeometry {
  int height, width, channels, kernel, stride, pad, out_height, out_width;
};

ConvGeometry Geometry(const Backend::ConvShape& s) {
  return {s.height, s.width, s.channels, s.kernel, s.stride, s.pad, s.out_height(), s.out_width()};
}

// One thread per cols entry (row (n, oy, ox), column (ky, kx, c)), as Backend::Im2Col says.
__global__ void Im2ColKernel(const float* __restrict__ x, ConvGeometry g, int64_t n,
                             float* __restrict__ cols) {
  const int64_t width = static_cast<int64_t>(g.kernel) * g.kernel * g.channels;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / width;
    const int col = static_cast<int>(i - row * width);
    const int c = col % g.channels, kx = (col / g.channels) % g.kernel,
              ky = col / (g.channels * g.kernel);
    const int ox = static_cast<int>(row % g.out_width);
    const int oy = static_cast<int>((row / g.out_width) % g.out_height);
    const int64_t image = row / (static_cast<int64_t>(g.out_width) * g.out_height);
    const int y = oy * g.stride - g.pad + ky, xx = ox * g.stride - g.pad + kx;
    cols[i] = (y < 0 || y >= g.height || xx < 0 || xx >= g.width)
                  ? 0.0f
                  : x[((image * g.height + y) * g.width + xx) * g.channels + c];
  }
}

// One thread per pixel entry of dx: the sum, in a fixed order, of the cols entries copied from it.
__global__ void Col2ImKernel(const float* __restrict__ cols, ConvGeometry g, int64_t n,
                             float* __restrict__ dx) {
  const int64_t width = static_cast<int64_t>(g.kernel) * g.kernel * g.channels;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(i % g.channels);
    const int xx = static_cast<int>((i / g.channels) % g.width);
    const int y = static_cast<int>((i / (static_cast<int64_t>(g.channels) * g.width)) % g.height);
    const int64_t image = i / (static_cast<int64_t>(g.channels) * g.width * g.height);
    float sum = 0.0f;
    for (int ky = 0; ky < g.kernel; ++ky) {
      const int oy_stride = y + g.pad - ky;
      if (oy_stride < 0 || oy_stride % g.stride != 0 || oy_stride / g.stride >= g.out_height) {
        continue;
      }
      for (int kx = 0; kx < g.kernel; ++kx) {
        const int ox_stride = xx + g.pad - kx;
        if (ox_stride < 0 || ox_stride % g.stride != 0 || ox_stride / g.stride >= g.out_width) {
          continue;
        }
        const int64_t row =
            (image * g.out_height + oy_stride / g.stride) * g.out_width + ox_stride / g.stride;
        sum += cols[row * width + (ky * g.kernel + kx) * g.channels + c];
      }
    }
    dx[i] = sum;
  }
}

// One thread per output of a window x window max-pool (NHWC).
__global__ void MaxPoolKernel(const float* __restrict__ x, int height, int width, int channels,
                              int window, int64_t n, float* __restrict__ y,
                              int32_t* __restrict__ argmax) {
  const int oh = height / window, ow = width / window;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(i % channels);
    const int ox = static_cast<int>((i / channels) % ow);
    const int oy = static_cast<int>((i / (static_cast<int64_t>(channels) * ow)) % oh);
    const int64_t image = i / (static_cast<int64_t>(channels) * ow * oh);
    int64_t best = -1;
    for (int dy = 0; dy < window; ++dy) {
      for (int dx = 0; dx < window; ++dx) {
        const int64_t at =
            ((image * height + oy * window + dy) * width + ox * window + dx) * channels + c;
        if (best < 0 || x[at] > x[best]) best = at;
      }
    }
    y[i] = x[best];
    argmax[i] = static_cast<int32_t>(best);
  }
}

__global__ void ScatterKernel(const float* __restrict__ dy, const int32_t* __restrict__ argmax,
                              int64_t n, float* __restrict__ dx) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dx[argmax[i]] = dy[i];
  }
}

// Block (kColumnTile, kRowGroups): thread (tx, ty) sums rows ty, ty + kRowGroups, ... of column
// blockIdx.x * kColumnTile + tx, reads coalesced along the row; then ty == 0 adds the kRowGroups
// partial sums in a fixed order, so results are deterministic.
__global__ void ColumnSumKernel(const float* __restrict__ x, int rows, int cols,
                                float* __restrict__ out) {
  __shared__ float partial[kRowGroups][kColumnTile + 1];
  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const int col = blockIdx.x * kColumnTile + tx;
  float sum = 0.0f;
  if (col < cols) {
    for (int r = ty; r < rows; r += kRowGroups) sum += x[static_cast<int64_t>(r) * cols + col];
  }
  partial[ty][tx] = sum;
  __syncthreads();
  if (ty == 0 && col < cols) {
    float total = 0.0f;
    for (int g = 0; g < kRowGroups; ++g) total += partial[g][tx];
    out[col] = total;
  }
}

// Whether candidate (v, i) beats (best, best_i) as std::max_element would pick: the larger value,
// the lower index on a tie. best_i == INT_MAX marks "nothing seen yet" (a lane with no columns).
__device__ __forceinline__ bool BeatsArgmax(float v, int i, float best, int best_i) {
  return v > best || (v == best && i < best_i);
}

// One block; warp w takes rows w, w + kSoftmaxWarps, ... For each: max and argmax, sum of exp, the
// row's loss and whether its argmax hits the label, and (if dlogits is set) the row of
// d(mean loss)/d(logits). Then the warps' sums are added in a fixed order into *summary, so the
// result is deterministic. dlogits may alias logits, as on the CPU: every element of a row is read
// (by the lane that writes it) before any write of the row.
__global__ void __launch_bounds__(kSoftmaxThreads)
    SoftmaxCrossEntropyKernel(const float* logits, const int32_t* labels, int rows, int cols,
                              float* dlogits, Backend::LossSummary* __restrict__ summary) {
  __shared__ double warp_loss[kSoftmaxWarps];
  __shared__ unsigned long long warp_hits[kSoftmaxWarps];
  __shared__ int warp_bad[kSoftmaxWarps];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  double my_loss = 0.0;  // meaningful in lane 0
  unsigned long long my_hits = 0;
  int my_bad = INT_MAX;
  for (int row = warp; row < rows; row += kSoftmaxWarps) {  // uniform across the warp
    const float* x = logits + static_cast<int64_t>(row) * cols;
    float best = -INFINITY;
    int best_i = INT_MAX;  // "nothing seen yet" (a lane with no columns)
    for (int c = lane; c < cols; c += kWarp) {
      float v = x[c];
      if (BeatsArgmax(v, c, best, best_i)) {
        best = v;
        best_i = c;
      }
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      float other = __shfl_xor_sync(0xffffffffu, best, offset);
      int other_i = __shfl_xor_sync(0xffffffffu, best_i, offset);
      if (BeatsArgmax(other, other_i, best, best_i)) {
        best = other;
        best_i = other_i;
      }
    }
    const float mx = best;
    const int label = labels[row];
    const bool valid = label >= 0 && label < cols;
    const float label_logit = valid ? x[label] : 0.0f;

    float sum = 0.0f;
    for (int c = lane; c < cols; c += kWarp) sum += expf(x[c] - mx);
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    }
    if (lane == 0) {
      if (valid) {
        my_loss += logf(sum) - (label_logit - mx);
        my_hits += best_i == label ? 1 : 0;
      } else {
        my_bad = min(my_bad, row);
      }
    }
    if (dlogits != nullptr) {
      __syncwarp();  // all reads of x[label] are done before any lane overwrites an aliased row
      float* d = dlogits + static_cast<int64_t>(row) * cols;
      const float n = static_cast<float>(rows);
      for (int c = lane; c < cols; c += kWarp) {
        float p = expf(x[c] - mx) / sum;
        d[c] = (p - (c == label ? 1.0f : 0.0f)) / n;
      }
    }
    __syncwarp();  // the next row's shuffles start together
  }
  if (lane == 0) {
    warp_loss[warp] = my_loss;
    warp_hits[warp] = my_hits;
    warp_bad[warp] = my_bad;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    Backend::LossSummary total;
    int bad = INT_MAX;
    for (int w = 0; w < kSoftmaxWarps; ++w) {
      total.loss_sum += warp_loss[w];
      total.hits += static_cast<int64_t>(warp_hits[w]);
      bad = min(bad, warp_bad[w]);
    }
    total.first_bad_row = bad == INT_MAX ? -1 : bad;
    *summary = total;
  }
}

static_assert(sizeof(Backend::LossSummary) == 24, "LossSummary is shared by host and device code");

// ---- The backend ----

// A CUDA graph recorded by RunRecorded.
class CudaRecording : public Backend::Recording {
 public:
  explicit CudaRecording(cudaGraphExec_t exec) : exec_(exec) {}
  ~CudaRecording() override { cudaGraphExecDestroy(exec_); }
  cudaGraphExec_t exec() const { return exec_; }

 private:
  cudaGraphExec_t exec_;
};

// A Backend on one GPU: one stream and one cuBLAS handle, all work queued in order on that stream.
// Used by one thread at a time (the Backend contract), which may change between calls: each call
// makes the backend's device current first. Create it with MakeCudaBackend.
class CudaBackend : public Backend {
 public:
  CudaBackend(int device, GemmMath math, bool graphs)
      : device_(device), math_(math), graphs_(graphs) {}

  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  ~CudaBackend() override {
    // Best effort, errors ignored: this may run after a sticky CUDA error or at process exit.
    cudaSetDevice(device_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    if (cublas_workspace_ != nullptr) cudaFree(cublas_workspace_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Creates the stream and the cuBLAS handle with its workspace. On failure, returns why; the
  // destructor releases whatever was made.
  absl::Status Init() {
    auto cuda_error = [this](const char* what, cudaError_t e) {
      cudaGetLastError();  // clear it, so a later launch check does not report it again
      return absl::InternalError(
          absl::StrCat("CUDA device ", device_, ": ", what, " failed: ", CudaErrorText(e)));
    };
    cudaError_t e = cudaSetDevice(device_);
    if (e != cudaSuccess) return cuda_error("cudaSetDevice", e);
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, device_);
    if (e != cudaSuccess) return cuda_error("cudaGetDeviceProperties", e);
    max_blocks_ = std::max(1, prop.multiProcessorCount) * (2048 / kThreads);
    // Non-blocking: unordered with the legacy default stream that other code in the process uses.
    e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    if (e != cudaSuccess) return cuda_error("cudaStreamCreateWithFlags", e);
    e = cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes);
    if (e != cudaSuccess) return cuda_error("cudaMalloc of the cuBLAS workspace", e);

    auto cublas_error = [this](const char* what, cublasStatus_t s) {
      return absl::InternalError(
          absl::StrCat("CUDA device ", device_, ": ", what, " failed: ", cublasGetStatusString(s)));
    };
    cublasStatus_t s = cublasCreate(&cublas_);
    if (s != CUBLAS_STATUS_SUCCESS) {
      cublas_ = nullptr;
      return cublas_error("cublasCreate", s);
    }
    s = cublasSetStream(cublas_, stream_);
    if (s != CUBLAS_STATUS_SUCCESS) return cublas_error("cublasSetStream", s);
    // A workspace of our own (after SetStream, which resets it): cuBLAS then allocates nothing
    // while a graph is being recorded.
    s = cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes);
    if (s != CUBLAS_STATUS_SUCCESS) return cublas_error("cublasSetWorkspace", s);
    // bf16 goes through cublasGemmEx's compute type instead of the math mode.
    s = cublasSetMathMode(
        cublas_, math_ == GemmMath::kTf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
    if (s != CUBLAS_STATUS_SUCCESS) return cublas_error("cublasSetMathMode", s);

    PS_LOG(INFO) << "CUDA backend on cuda:" << device_ << " (" << prop.name << ", sm_" << prop.major
                 << prop.minor << ", " << prop.multiProcessorCount << " SMs, "
                 << (prop.totalGlobalMem >> 20) << " MiB), GEMM math " << GemmMathName(math_)
                 << " (PS_CUDA_MATH), CUDA graphs " << (graphs_ ? "on" : "off")
                 << " (PS_CUDA_GRAPHS)";
    return absl::OkStatus();
  }

  std::string Name() const override { return absl::StrCat("cuda:", device_); }

  void* Allocate(size_t bytes) override {
    UseDevice();
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));  // never null, even for 0 bytes
    if (e != cudaSuccess) {
      size_t free_bytes = 0, total_bytes = 0;
      cudaGetLastError();
      cudaMemGetInfo(&free_bytes, &total_bytes);
      PS_LOG(ERROR) << "cudaMalloc(" << bytes << " bytes) on cuda:" << device_
                    << " failed: " << CudaErrorText(e) << "; " << (free_bytes >> 20) << " of "
                    << (total_bytes >> 20) << " MiB free";
      std::abort();
    }
    return p;
  }

  void Free(void* p) override {
    if (p == nullptr) return;
    UseDevice();
    PS_CUDA_CHECK(cudaStreamSynchronize(stream_));  // kernels queued on p finish first
    PS_CUDA_CHECK(cudaFree(p));
  }

  // From pinned memory (AllocateHost) these return at once; from pageable memory CUDA stages the
  // copy and may block, but the result is the same.
  void CopyToDeviceAsync(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    UseDevice();
    PS_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
  }

  void CopyToHostAsync(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    UseDevice();
    PS_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  }

  // Also where a fault inside an earlier kernel surfaces (and aborts, naming it).
  void Synchronize() override {
    UseDevice();
    PS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void RunRecorded(std::unique_ptr<Recording>* recording,
                   absl::FunctionRef<void()> queue_work) override {
    UseDevice();
    if (*recording != nullptr) {
      PS_CUDA_CHECK(
          cudaGraphLaunch(static_cast<CudaRecording*>(recording->get())->exec(), stream_));
      return;
    }
    if (!graphs_) {
      queue_work();
      return;
    }
    // A CUDA error inside queue_work aborts, as everywhere else in this backend; a recording that
    // cannot be ended or instantiated (an operation graphs do not support) falls back to plain
    // launches.
    // Thread-local capture: another thread's CUDA calls (none are expected) cannot break it.
    PS_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    queue_work();
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (e != cudaSuccess) {  // recording did not run the work: run it one kernel at a time
      cudaGetLastError();
      PS_LOG(WARNING) << "cuda:" << device_ << ": recording a CUDA graph failed ("
                      << CudaErrorText(e) << "); launching kernels one by one from now on";
      graphs_ = false;
      queue_work();
      return;
    }
    auto made = std::make_unique<CudaRecording>(exec);
    PS_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    *recording = std::move(made);
  }

  void* AllocateHost(size_t bytes) override {
    UseDevice();
    void* p = nullptr;
    cudaError_t e = cudaMallocHost(&p, std::max<size_t>(bytes, 1));
    if (e != cudaSuccess) {
      cudaGetLastError();
      PS_LOG(ERROR) << "cudaMallocHost(" << bytes << " bytes) failed: " << CudaErrorText(e);
      std::abort();
    }
    return p;
  }

  void FreeHost(void* p) override {
    if (p == nullptr) return;
    UseDevice();
    PS_CUDA_CHECK(cudaStreamSynchronize(stream_));  // copies queued from p finish first
    PS_CUDA_CHECK(cudaFreeHost(p));
  }

  void GatherRows(const void* src, const int32_t* index, int rows, size_t row_bytes,
                  void* dst) override {
    const int64_t words = static_cast<int64_t>(row_bytes / 4);
    const int64_t n = static_cast<int64_t>(rows) * words;
    if (n <= 0) return;
    UseDevice();
    auto s = static_cast<const uint32_t*>(src);
    auto d = static_cast<uint32_t*>(dst);
    if (FitsInt32(n)) {
      GatherRowsKernel<int32_t><<<Blocks(n), kThreads, 0, stream_>>>(
          s, index, static_cast<int32_t>(n), static_cast<int32_t>(words), d);
    } else {
      GatherRowsKernel<int64_t><<<Blocks(n), kThreads, 0, stream_>>>(s, index, n, words, d);
    }
    PS_CUDA_CHECK_LAUNCH();
  }

  // cuBLAS is column-major, and a row-major [r,c] matrix is its column-major [c,r] transpose. So
  // compute C^T = op(B)^T * op(A)^T: pass B first, then A, with m and n swapped; the transpose
  // flags and leading dimensions are those of the row-major layout (as in cblas RowMajor).
  void Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a,
            const float* b, float beta, float* c) override {
    if (m <= 0 || n <= 0) return;
    UseDevice();
    const cublasOperation_t op_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    // max(1, ...): cuBLAS rejects a leading dimension of 0 even when k == 0 reads nothing.
    const int lda = std::max(1, transpose_a ? m : k);
    const int ldb = std::max(1, transpose_b ? k : n);
    const int ldc = n;
    if (math_ == GemmMath::kBf16) {
      // Float in and out; cuBLAS may round the inputs to bf16 and use tensor cores.
      PS_CUBLAS_CHECK(cublasGemmEx(cublas_, op_b, op_a, n, m, k, &alpha, b, CUDA_R_32F, ldb, a,
                                   CUDA_R_32F, lda, &beta, c, CUDA_R_32F, ldc,
                                   CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT));
    } else {
      PS_CUBLAS_CHECK(
          cublasSgemm(cublas_, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc));
    }
  }

  void AddBiasActivate(float* z, const float* bias, int rows, int cols, bool relu) override {
    const int64_t n = static_cast<int64_t>(rows) * cols;
    if (n <= 0) return;
    UseDevice();
    if (FitsInt32(n)) {
      AddBiasActivateKernel<int32_t>
          <<<Blocks(n), kThreads, 0, stream_>>>(z, bias, static_cast<int32_t>(n), cols, relu);
    } else {
      AddBiasActivateKernel<int64_t><<<Blocks(n), kThreads, 0, stream_>>>(z, bias, n, cols, relu);
    }
    PS_CUDA_CHECK_LAUNCH();
  }

  void ReluBackward(float* dz, const float* activation, int64_t n) override {
    if (n <= 0) return;
    UseDevice();
    if (FitsInt32(n)) {
      ReluBackwardKernel<int32_t>
          <<<Blocks(n), kThreads, 0, stream_>>>(dz, activation, static_cast<int32_t>(n));
    } else {
      ReluBackwardKernel<int64_t><<<Blocks(n), kThreads, 0, stream_>>>(dz, activation, n);
    }
    PS_CUDA_CHECK_LAUNCH();
  }

  void ColumnSum(const float* x, int rows, int cols, float* out) override {
    if (cols <= 0) return;
    UseDevice();
    const int blocks = (cols + kColumnTile - 1) / kColumnTile;
    ColumnSumKernel<<<blocks, dim3(kColumnTile, kRowGroups), 0, stream_>>>(x, std::max(rows, 0),
                                                                           cols, out);
    PS_CUDA_CHECK_LAUNCH();
  }

  void Im2Col(const float* x, const ConvShape& s, float* cols) override {
    const int64_t n = s.rows() * s.cols();
    if (n <= 0) return;
    UseDevice();
    Im2ColKernel<<<Blocks(n), kThreads, 0, stream_>>>(x, Geometry(s), n, cols);
    PS_CUDA_CHECK_LAUNCH();
  }

  void Col2Im(const float* cols, const ConvShape& s, float* dx) override {
    const int64_t n = static_cast<int64_t>(s.batch) * s.height * s.width * s.channels;
    if (n <= 0) return;
    UseDevice();
    Col2ImKernel<<<Blocks(n), kThreads, 0, stream_>>>(cols, Geometry(s), n, dx);
    PS_CUDA_CHECK_LAUNCH();
  }

  void MaxPool(const float* x, int batch, int height, int width, int channels, int window, float* y,
               int32_t* argmax) override {
    const int64_t n = static_cast<int64_t>(batch) * (height / window) * (width / window) * channels;
    if (n <= 0) return;
    UseDevice();
    MaxPoolKernel<<<Blocks(n), kThreads, 0, stream_>>>(x, height, width, channels, window, n, y,
                                                       argmax);
    PS_CUDA_CHECK_LAUNCH();
  }

  void MaxPoolBackward(const float* dy, const int32_t* argmax, int64_t n, int64_t x_size,
                       float* dx) override {
    if (x_size <= 0) return;
    UseDevice();
    PS_CUDA_CHECK(cudaMemsetAsync(dx, 0, x_size * sizeof(float), stream_));
    if (n <= 0) return;
    ScatterKernel<<<Blocks(n), kThreads, 0, stream_>>>(dy, argmax, n, dx);
    PS_CUDA_CHECK_LAUNCH();
  }

  void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int cols,
                           float* dlogits, LossSummary* summary) override {
    UseDevice();
    SoftmaxCrossEntropyKernel<<<1, kSoftmaxThreads, 0, stream_>>>(
        logits, labels, std::max(rows, 0), std::max(cols, 0), dlogits, summary);
    PS_CUDA_CHECK_LAUNCH();
  }

 private:
  // Makes this backend's GPU the thread's current one (a no-op when it already is, as it is while
  // RunRecorded records).
  void UseDevice() {
    int current = -1;
    PS_CUDA_CHECK(cudaGetDevice(&current));
    if (current != device_) PS_CUDA_CHECK(cudaSetDevice(device_));
  }

  // Grid for the grid-stride kernels: enough blocks to fill the GPU, no more.
  int Blocks(int64_t n) const {
    return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, max_blocks_));
  }
  // Whether a grid-stride loop over n elements can count in int32_t: its index runs up to
  // n - 1 + the grid's size, which must not wrap.
  bool FitsInt32(int64_t n) const {
    return n + static_cast<int64_t>(Blocks(n)) * kThreads <= INT_MAX;
  }

  const int device_;
  const GemmMath math_;
  bool graphs_;  // RunRecorded records graphs; cleared if recording ever fails
  int max_blocks_ = 1;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* cublas_workspace_ = nullptr;
};

}  // namespace

absl::Status CheckCudaSettings() {
  if (absl::StatusOr<GemmMath> math = GemmMathFromEnv(); !math.ok()) return math.status();
  if (absl::StatusOr<bool> graphs = GraphsFromEnv(); !graphs.ok()) return graphs.status();
  return absl::OkStatus();
}

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess) return std::max(count, 0);
  cudaGetLastError();  // clear it, so that a later launch check does not report it again
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);  // 0 when no NVIDIA driver is installed
  cudaRuntimeGetVersion(&runtime);
  if (e == cudaErrorNoDevice || driver == 0) return 0;
  auto version = [](int v) { return absl::StrCat(v / 1000, ".", v % 1000 / 10); };
  if (e == cudaErrorInsufficientDriver) {
    return absl::FailedPreconditionError(
        absl::StrCat("the NVIDIA driver supports CUDA up to ", version(driver),
                     " but this build needs CUDA ", version(runtime), ": install a newer driver"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("the GPUs cannot be counted: cudaGetDeviceCount failed: ", CudaErrorText(e)));
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device) {
  absl::StatusOr<GemmMath> math = GemmMathFromEnv();
  if (!math.ok()) return math.status();
  absl::StatusOr<bool> graphs = GraphsFromEnv();
  if (!graphs.ok()) return graphs.status();
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) return count.status();
  if (*count == 0) return absl::FailedPreconditionError("no CUDA device: the driver reports none");
  if (device < 0 || device >= *count) {
    return absl::InvalidArgumentError(absl::StrCat("--device=cuda:", device, " but only ", *count,
                                                   *count == 1 ? " GPU" : " GPUs", " (cuda:0..",
                                                   *count - 1, ")"));
  }
  auto backend = std::make_unique<CudaBackend>(device, *math, *graphs);
  absl::Status status = backend->Init();
  if (!status.ok()) return status;
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace ps
