// CPU backend: GEMM through CBLAS (OpenBLAS), the rest as plain loops the compiler vectorises.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "kernels/backend.h"

namespace ps {
namespace {

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(int threads) { openblas_set_num_threads(std::max(1, threads)); }

  std::string Name() const override { return "cpu"; }

  void* Allocate(size_t bytes) override {
    void* p = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void Free(void* p) override { std::free(p); }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void* AllocateHost(size_t bytes) override { return Allocate(bytes); }
  void FreeHost(void* p) override { Free(p); }

  void GatherRows(const void* src, const int32_t* index, int rows, size_t row_bytes,
                  void* dst) override {
    for (int r = 0; r < rows; ++r) {
      std::memcpy(static_cast<char*>(dst) + r * row_bytes,
                  static_cast<const char*>(src) + index[r] * row_bytes, row_bytes);
    }
  }

  void Gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, const float* b,
            float beta, float* c) override {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
                k, alpha, a, ta ? m : k, b, tb ? k : n, beta, c, n);
  }

  void AddBiasActivate(float* z, const float* bias, int rows, int cols, bool relu) override {
    for (int r = 0; r < rows; ++r) {
      float* row = z + static_cast<int64_t>(r) * cols;
      for (int c = 0; c < cols; ++c) {
        float v = row[c] + bias[c];
        row[c] = relu ? std::max(v, 0.0f) : v;
      }
    }
  }

  void ReluBackward(float* dz, const float* activation, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) dz[i] = activation[i] > 0 ? dz[i] : 0.0f;
  }

  void ColumnSum(const float* x, int rows, int cols, float* out) override {
    std::fill(out, out + cols, 0.0f);
    for (int r = 0; r < rows; ++r) {
      const float* row = x + static_cast<int64_t>(r) * cols;
      for (int c = 0; c < cols; ++c) out[c] += row[c];
    }
  }

  float SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int cols,
                            float* dlogits, int64_t* correct) override {
    double loss = 0;
    int64_t hits = 0;
    for (int r = 0; r < rows; ++r) {
      const float* x = logits + static_cast<int64_t>(r) * cols;
      int argmax = static_cast<int>(std::max_element(x, x + cols) - x);
      float mx = x[argmax];
      double sum = 0;
      for (int c = 0; c < cols; ++c) sum += std::exp(static_cast<double>(x[c] - mx));
      double log_sum = std::log(sum);
      loss += log_sum - (x[labels[r]] - mx);
      hits += argmax == labels[r];
      if (dlogits != nullptr) {
        float* d = dlogits + static_cast<int64_t>(r) * cols;
        for (int c = 0; c < cols; ++c) {
          double p = std::exp(static_cast<double>(x[c] - mx) - log_sum);
          d[c] = static_cast<float>((p - (c == labels[r] ? 1.0 : 0.0)) / rows);
        }
      }
    }
    if (correct != nullptr) *correct = hits;
    return static_cast<float>(loss / rows);
  }
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace ps
