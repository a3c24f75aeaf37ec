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

constexpr int kThreads = 256;  // threads per block for every kernel here
constexpr int kWarp = 32;
constexpr int kRowsPerBlock = kThreads / kWarp;  // softmax: one warp per row
constexpr int kColumnTile = 32;                  // column sum: 32 columns x 8 row groups per block
constexpr int kRowGroups = kThreads / kColumnTile;

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

__global__ void AddBiasActivateKernel(float* z, const float* __restrict__ bias, int64_t n, int cols,
                                      bool relu) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = z[i] + bias[i % cols];
    // Written as std::max(v, 0.0f) evaluates, so NaN and -0.0 come out as on the CPU.
    z[i] = relu ? (v < 0.0f ? 0.0f : v) : v;
  }
}

// 4-byte words: word w of row r comes from word w of row index[r].
__global__ void GatherRowsKernel(const uint32_t* __restrict__ src,
                                 const int32_t* __restrict__ index, int64_t n,
                                 int64_t words_per_row, uint32_t* __restrict__ dst) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / words_per_row;
    dst[i] = src[index[r] * words_per_row + (i - r * words_per_row)];
  }
}

__global__ void ReluBackwardKernel(float* dz, const float* __restrict__ activation, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (!(activation[i] > 0.0f)) dz[i] = 0.0f;
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

// One warp per row: max and argmax, sum of exp, the row's loss and whether its argmax hits the
// label, and (if dlogits is set) the row of d(mean loss)/d(logits). A label outside [0, cols)
// marks the row with hit = -1 for the host to report. dlogits may alias logits, as on the CPU:
// every element is read (by the lane that writes it) before any write of the row.
__global__ void SoftmaxCrossEntropyRowsKernel(const float* logits, const int32_t* labels, int rows,
                                              int cols, float* dlogits, float* row_loss,
                                              int* row_hit) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;  // uniform across the warp, so the shuffles below see all 32 lanes
  const float* x = logits + static_cast<int64_t>(row) * cols;

  float best = -INFINITY;
  int best_i = INT_MAX;
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
    row_loss[row] = valid ? logf(sum) - (label_logit - mx) : 0.0f;
    row_hit[row] = valid ? (best_i == label ? 1 : 0) : -1;
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
}

struct LossSummary {
  double loss_sum;
  unsigned long long hits;
  int first_bad_row;  // INT_MAX when every label was in range
};

// One block: sums the per-row losses (in double) and hits in a fixed order, deterministically.
__global__ void SumRowLossesKernel(const float* __restrict__ row_loss,
                                   const int* __restrict__ row_hit, int rows,
                                   LossSummary* __restrict__ out) {
  __shared__ double loss[kThreads];
  __shared__ unsigned long long hits[kThreads];
  __shared__ int bad[kThreads];
  const int t = threadIdx.x;
  double my_loss = 0.0;
  unsigned long long my_hits = 0;
  int my_bad = INT_MAX;
  for (int r = t; r < rows; r += kThreads) {
    int hit = row_hit[r];
    if (hit < 0) {
      my_bad = min(my_bad, r);
    } else {
      my_loss += row_loss[r];
      my_hits += hit;
    }
  }
  loss[t] = my_loss;
  hits[t] = my_hits;
  bad[t] = my_bad;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (t < stride) {
      loss[t] += loss[t + stride];
      hits[t] += hits[t + stride];
      bad[t] = min(bad[t], bad[t + stride]);
    }
    __syncthreads();
  }
  if (t == 0) *out = LossSummary{loss[0], hits[0], bad[0]};
}

// ---- The backend ----

// A Backend on one GPU: one stream and one cuBLAS handle, all work queued in order on that stream.
// Used by one thread at a time (the Backend contract), which may change between calls: each call
// makes the backend's device current first. Create it with MakeCudaBackend.
class CudaBackend : public Backend {
 public:
  CudaBackend(int device, GemmMath math) : device_(device), math_(math) {}

  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  ~CudaBackend() override {
    // Best effort, errors ignored: this may run after a sticky CUDA error or at process exit.
    cudaSetDevice(device_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (row_loss_ != nullptr) cudaFree(row_loss_);
    if (row_hit_ != nullptr) cudaFree(row_hit_);
    if (summary_ != nullptr) cudaFree(summary_);
    if (summary_host_ != nullptr) cudaFreeHost(summary_host_);
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Creates the stream, the cuBLAS handle and the fixed scratch. On failure, returns why; the
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
    e = cudaMalloc(reinterpret_cast<void**>(&summary_), sizeof(LossSummary));
    if (e != cudaSuccess) return cuda_error("cudaMalloc", e);
    e = cudaMallocHost(reinterpret_cast<void**>(&summary_host_), sizeof(LossSummary));
    if (e != cudaSuccess) return cuda_error("cudaMallocHost", e);

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
    // bf16 goes through cublasGemmEx's compute type instead of the math mode.
    s = cublasSetMathMode(
        cublas_, math_ == GemmMath::kTf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
    if (s != CUBLAS_STATUS_SUCCESS) return cublas_error("cublasSetMathMode", s);

    PS_LOG(INFO) << "CUDA backend on cuda:" << device_ << " (" << prop.name << ", sm_" << prop.major
                 << prop.minor << ", " << prop.multiProcessorCount << " SMs, "
                 << (prop.totalGlobalMem >> 20) << " MiB), GEMM math " << GemmMathName(math_)
                 << " (PS_CUDA_MATH)";
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

  // Both copies wait for completion, so the host buffer may be reused or read at once.
  void CopyToDevice(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    UseDevice();
    PS_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
    PS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    UseDevice();
    PS_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    PS_CUDA_CHECK(cudaStreamSynchronize(stream_));
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
    GatherRowsKernel<<<Blocks(n), kThreads, 0, stream_>>>(static_cast<const uint32_t*>(src), index,
                                                          n, words, static_cast<uint32_t*>(dst));
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
    AddBiasActivateKernel<<<Blocks(n), kThreads, 0, stream_>>>(z, bias, n, cols, relu);
    PS_CUDA_CHECK_LAUNCH();
  }

  void ReluBackward(float* dz, const float* activation, int64_t n) override {
    if (n <= 0) return;
    UseDevice();
    ReluBackwardKernel<<<Blocks(n), kThreads, 0, stream_>>>(dz, activation, n);
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

  // Two kernels (per-row loss, then a one-block deterministic sum) and one small copy back, which
  // is also the sync point. A label outside [0, cols) aborts with the row and label named.
  float SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int cols,
                            float* dlogits, int64_t* correct) override {
    if (rows <= 0) {  // the CPU's 0/0
      if (correct != nullptr) *correct = 0;
      return std::numeric_limits<float>::quiet_NaN();
    }
    UseDevice();
    EnsureRowScratch(rows);
    const int blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    SoftmaxCrossEntropyRowsKernel<<<blocks, kThreads, 0, stream_>>>(
        logits, labels, rows, std::max(cols, 0), dlogits, row_loss_, row_hit_);
    PS_CUDA_CHECK_LAUNCH();
    SumRowLossesKernel<<<1, kThreads, 0, stream_>>>(row_loss_, row_hit_, rows, summary_);
    PS_CUDA_CHECK_LAUNCH();
    PS_CUDA_CHECK(cudaMemcpyAsync(summary_host_, summary_, sizeof(LossSummary),
                                  cudaMemcpyDeviceToHost, stream_));
    PS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const LossSummary summary = *summary_host_;
    if (summary.first_bad_row != INT_MAX) {
      int32_t label = 0;
      CopyToHost(&label, labels + summary.first_bad_row, sizeof(label));
      PS_LOG(ERROR) << "SoftmaxCrossEntropy on cuda:" << device_ << ": label " << label
                    << " of row " << summary.first_bad_row << " is outside [0, " << cols << ")";
      std::abort();
    }
    if (correct != nullptr) *correct = static_cast<int64_t>(summary.hits);
    return static_cast<float>(summary.loss_sum / rows);
  }

 private:
  void UseDevice() { PS_CUDA_CHECK(cudaSetDevice(device_)); }

  // Grid for the grid-stride kernels: enough blocks to fill the GPU, no more.
  int Blocks(int64_t n) const {
    return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, max_blocks_));
  }

  // Grows the per-row softmax scratch (never shrinks); hot-path calls allocate nothing.
  void EnsureRowScratch(int rows) {
    if (rows <= row_capacity_) return;
    const int capacity = std::max(rows, 2 * row_capacity_);
    PS_CUDA_CHECK(cudaStreamSynchronize(stream_));  // queued kernels may still use the old ones
    if (row_loss_ != nullptr) PS_CUDA_CHECK(cudaFree(row_loss_));
    if (row_hit_ != nullptr) PS_CUDA_CHECK(cudaFree(row_hit_));
    row_loss_ = nullptr;
    row_hit_ = nullptr;
    PS_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&row_loss_), capacity * sizeof(float)));
    PS_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&row_hit_), capacity * sizeof(int)));
    row_capacity_ = capacity;
  }

  const int device_;
  const GemmMath math_;
  int max_blocks_ = 1;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  float* row_loss_ = nullptr;  // [row_capacity_] per-row loss
  int* row_hit_ = nullptr;     // [row_capacity_] 1 hit, 0 miss, -1 label out of range
  int row_capacity_ = 0;
  LossSummary* summary_ = nullptr;       // device
  LossSummary* summary_host_ = nullptr;  // pinned host copy
};

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear it: no driver or no device is an answer here, not an error
    return 0;
  }
  return std::max(count, 0);
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device) {
  absl::StatusOr<GemmMath> math = GemmMathFromEnv();
  if (!math.ok()) return math.status();
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device: cudaGetDeviceCount failed: ", CudaErrorText(e)));
  }
  if (count <= 0) return absl::FailedPreconditionError("no CUDA device: the driver reports none");
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("--device=cuda:", device, " but only ", count,
                                                   count == 1 ? " GPU" : " GPUs", " (cuda:0..",
                                                   count - 1, ")"));
  }
  auto backend = std::make_unique<CudaBackend>(device, *math);
  absl::Status status = backend->Init();
  if (!status.ok()) return status;
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace ps
