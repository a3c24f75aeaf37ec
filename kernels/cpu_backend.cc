// CPU backend: GEMM through CBLAS (OpenBLAS), the rest as plain loops the compiler vectorises.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "common/log.h"
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
  void* AllocateHost(size_t bytes) override { return Allocate(bytes); }
  void FreeHost(void* p) override { Free(p); }
  // Nothing is ever queued here: every call has done its work when it returns.
  void CopyToDeviceAsync(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void CopyToHostAsync(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void Synchronize() override {}
  void RunRecorded(std::unique_ptr<Recording>*, absl::FunctionRef<void()> queue_work) override {
    queue_work();
  }

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

  void Im2Col(const float* x, const ConvShape& s, float* cols) override {
    const int oh = s.out_height(), ow = s.out_width(), c = s.channels;
    float* out = cols;
    for (int n = 0; n < s.batch; ++n) {
      const float* image = x + static_cast<int64_t>(n) * s.height * s.width * c;
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox) {
          for (int ky = 0; ky < s.kernel; ++ky) {
            const int y = oy * s.stride - s.pad + ky;
            for (int kx = 0; kx < s.kernel; ++kx, out += c) {
              const int xx = ox * s.stride - s.pad + kx;
              if (y < 0 || y >= s.height || xx < 0 || xx >= s.width) {
                std::fill(out, out + c, 0.0f);
              } else {
                std::memcpy(out, image + (static_cast<int64_t>(y) * s.width + xx) * c,
                            c * sizeof(float));
              }
            }
          }
        }
      }
    }
  }

  void Col2Im(const float* cols, const ConvShape& s, float* dx) override {
    const int oh = s.out_height(), ow = s.out_width(), c = s.channels;
    std::fill(dx, dx + static_cast<int64_t>(s.batch) * s.height * s.width * c, 0.0f);
    const float* in = cols;
    for (int n = 0; n < s.batch; ++n) {
      float* image = dx + static_cast<int64_t>(n) * s.height * s.width * c;
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox) {
          for (int ky = 0; ky < s.kernel; ++ky) {
            const int y = oy * s.stride - s.pad + ky;
            for (int kx = 0; kx < s.kernel; ++kx, in += c) {
              const int xx = ox * s.stride - s.pad + kx;
              if (y < 0 || y >= s.height || xx < 0 || xx >= s.width) continue;
              float* pixel = image + (static_cast<int64_t>(y) * s.width + xx) * c;
              for (int k = 0; k < c; ++k) pixel[k] += in[k];
            }
          }
        }
      }
    }
  }

  void MaxPool(const float* x, int batch, int height, int width, int channels, int window, float* y,
               int32_t* argmax) override {
    const int oh = height / window, ow = width / window;
    int64_t i = 0;
    for (int n = 0; n < batch; ++n) {
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox) {
          for (int c = 0; c < channels; ++c, ++i) {
            int64_t best = -1;
            for (int dy = 0; dy < window; ++dy) {
              for (int dx = 0; dx < window; ++dx) {
                const int64_t at = ((static_cast<int64_t>(n) * height + oy * window + dy) * width +
                                    ox * window + dx) *
                                       channels +
                                   c;
                if (best < 0 || x[at] > x[best]) best = at;
              }
            }
            y[i] = x[best];
            argmax[i] = static_cast<int32_t>(best);
          }
        }
      }
    }
  }

  void MaxPoolBackward(const float* dy, const int32_t* argmax, int64_t n, int64_t x_size,
                       float* dx) override {
    std::fill(dx, dx + x_size, 0.0f);
    for (int64_t i = 0; i < n; ++i) dx[argmax[i]] = dy[i];
  }

  void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int cols,
                           float* dlogits, LossSummary* summary) override {
    LossSummary sum;
    for (int r = 0; r < rows; ++r) {
      const float* x = logits + static_cast<int64_t>(r) * cols;
      const int argmax = static_cast<int>(std::max_element(x, x + cols) - x);
      const float mx = x[argmax];
      const int32_t label = labels[r];
      const bool valid = label >= 0 && label < cols;
      double exp_sum = 0;
      for (int c = 0; c < cols; ++c) exp_sum += std::exp(static_cast<double>(x[c] - mx));
      const double log_sum = std::log(exp_sum);
      if (valid) {
        sum.loss_sum += log_sum - (x[label] - mx);
        sum.hits += argmax == label;
      } else if (sum.first_bad_row < 0) {
        sum.first_bad_row = r;
      }
      if (dlogits != nullptr) {  // x is read before d is written, element by element
        float* d = dlogits + static_cast<int64_t>(r) * cols;
        for (int c = 0; c < cols; ++c) {
          double p = std::exp(static_cast<double>(x[c] - mx) - log_sum);
          d[c] = static_cast<float>((p - (c == label ? 1.0 : 0.0)) / rows);
        }
      }
    }
    *summary = sum;
  }
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(int threads) {
  // Which kernels OpenBLAS picked for this processor decides most of the speed: say it, and say
  // when it fell back to old ones on a processor it does not know (Debian 12's OpenBLAS 0.3.21
  // does so on Sapphire Rapids Xeons, for instance: several times slower GEMMs).
  const std::string core = openblas_get_corename();
  PS_LOG(INFO) << "CPU backend: " << openblas_get_config() << ", " << core << " kernels, "
               << std::max(1, threads) << " thread(s)";
  const char* better = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                       : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                         : nullptr;
  const bool old_core = core == "Prescott" || core == "Core2" || core == "Penryn" ||
                        core == "Dunnington" || core == "Nehalem" || core == "Sandybridge";
  if (better != nullptr && old_core && std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    PS_LOG(WARNING) << "OpenBLAS chose its " << core << " kernels, but this processor has "
                    << (std::string(better) == "SkylakeX" ? "AVX-512" : "AVX2")
                    << ": start with OPENBLAS_CORETYPE=" << better
                    << " in the environment for much faster GEMMs";
  }
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace ps
