// What --device means, parsed and resolved without touching a GPU; the CPU backend's convolution
// and pooling kernels against direct loops.
#include "kernels/backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "tests/scoped_env.h"

namespace ps {
namespace {

TEST(BackendTest, DeviceNamesParse) {
  EXPECT_EQ(ParseDevice("cpu")->kind, DeviceRequest::kCpu);
  EXPECT_EQ(ParseDevice("auto")->kind, DeviceRequest::kAuto);
  EXPECT_EQ(ParseDevice("cuda")->kind, DeviceRequest::kCuda);
  EXPECT_EQ(ParseDevice("cuda")->index, -1);
  EXPECT_EQ(ParseDevice("cuda:3")->index, 3);
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:x", "CPU", ""}) {
    absl::StatusOr<DeviceRequest> request = ParseDevice(bad);
    ASSERT_FALSE(request.ok()) << bad;
    EXPECT_NE(std::string(request.status().message()).find("expected auto, cpu, cuda or cuda:N"),
              std::string::npos);
  }
}

TEST(BackendTest, LocalRankComesFromTheEnvironmentElseTheRank) {
  {
    ScopedEnv env("LOCAL_RANK", "3");
    EXPECT_EQ(LocalRank(5), 3);
  }
  for (const char* unusable : {"", "x", "-2"}) {
    ScopedEnv env("LOCAL_RANK", unusable);
    EXPECT_EQ(LocalRank(5), 5) << "LOCAL_RANK='" << unusable << "'";
  }
}

TEST(BackendTest, CpuIsAlwaysThere) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend("cpu", 1);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->Name(), "cpu");
  EXPECT_FALSE(MakeBackend("tpu", 1).ok());
}

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Im2Col + Gemm against a direct convolution (NHWC, weights [K, K, C, O]), for several strides,
// paddings and channel counts; and Col2Im as Im2Col's adjoint: <Im2Col(x), c> = <x, Col2Im(c)>.
TEST(BackendTest, Im2ColMakesAConvolutionAndCol2ImIsItsAdjoint) {
  std::unique_ptr<Backend> cpu = MakeCpuBackend(1);
  for (auto [kernel, stride, pad, channels] :
       {std::tuple{3, 1, 1, 1}, {5, 1, 2, 3}, {3, 2, 0, 2}, {4, 2, 1, 2}, {1, 1, 0, 4}}) {
    SCOPED_TRACE(testing::Message()
                 << "k" << kernel << " s" << stride << " p" << pad << " c" << channels);
    Backend::ConvShape s{.batch = 2,
                         .height = 7,
                         .width = 6,
                         .channels = channels,
                         .kernel = kernel,
                         .stride = stride,
                         .pad = pad};
    const int out = 3, oh = s.out_height(), ow = s.out_width();
    std::vector<float> x = Random(size_t{2} * 7 * 6 * channels, 1);
    std::vector<float> w = Random(s.cols() * out, 2);
    std::vector<float> cols(s.rows() * s.cols());
    cpu->Im2Col(x.data(), s, cols.data());
    std::vector<float> y(s.rows() * out);
    cpu->Gemm(false, false, s.rows(), out, s.cols(), 1.0f, cols.data(), w.data(), 0.0f, y.data());
    for (int n = 0; n < 2; ++n) {
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox) {
          for (int o = 0; o < out; ++o) {
            double want = 0;
            for (int ky = 0; ky < kernel; ++ky) {
              for (int kx = 0; kx < kernel; ++kx) {
                const int iy = oy * stride - pad + ky, ix = ox * stride - pad + kx;
                if (iy < 0 || iy >= 7 || ix < 0 || ix >= 6) continue;
                for (int c = 0; c < channels; ++c) {
                  want += x[((n * 7 + iy) * 6 + ix) * channels + c] *
                          w[((ky * kernel + kx) * channels + c) * out + o];
                }
              }
            }
            EXPECT_NEAR(y[((n * oh + oy) * ow + ox) * out + o], want, 1e-5);
          }
        }
      }
    }
    std::vector<float> c = Random(cols.size(), 3), dx(x.size());
    cpu->Col2Im(c.data(), s, dx.data());
    double left = 0, right = 0;
    for (size_t i = 0; i < cols.size(); ++i) left += double{cols[i]} * c[i];
    for (size_t i = 0; i < x.size(); ++i) right += double{x[i]} * dx[i];
    EXPECT_NEAR(left, right, 1e-4 * std::max(1.0, std::fabs(left)));
  }
}

// 2 x 2 pooling of a 5 x 4 image with 2 channels: the last row (a partial tile) is dropped; the
// maxima and where they came from; the backward pass puts each gradient back there.
TEST(BackendTest, MaxPoolTakesEachTilesMaximumAndSendsTheGradientBack) {
  std::unique_ptr<Backend> cpu = MakeCpuBackend(1);
  std::vector<float> x = Random(5 * 4 * 2, 4);
  std::vector<float> y(2 * 2 * 2);
  std::vector<int32_t> argmax(y.size());
  cpu->MaxPool(x.data(), 1, 5, 4, 2, 2, y.data(), argmax.data());
  for (int oy = 0; oy < 2; ++oy) {
    for (int ox = 0; ox < 2; ++ox) {
      for (int c = 0; c < 2; ++c) {
        const int i = (oy * 2 + ox) * 2 + c;
        float want = -2;
        for (int dy = 0; dy < 2; ++dy) {
          for (int dx = 0; dx < 2; ++dx) {
            want = std::max(want, x[((oy * 2 + dy) * 4 + ox * 2 + dx) * 2 + c]);
          }
        }
        EXPECT_EQ(y[i], want);
        EXPECT_EQ(x[argmax[i]], want);
      }
    }
  }
  std::vector<float> dy = Random(y.size(), 5), dx(x.size(), 7.0f);
  cpu->MaxPoolBackward(dy.data(), argmax.data(), y.size(), x.size(), dx.data());
  double sum = 0;
  for (float v : dx) sum += v;
  double want = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_EQ(dx[argmax[i]], dy[i]);
    want += dy[i];
  }
  EXPECT_NEAR(sum, want, 1e-6) << "every other entry is zero";
}

}  // namespace
}  // namespace ps
