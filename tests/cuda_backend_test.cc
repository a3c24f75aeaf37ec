// The CUDA backend against the CPU backend on random data. Every test that needs a GPU skips where
// there is none; the device tests hold on every machine and never skip.
#include "kernels/cuda_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "tests/scoped_env.h"

namespace ps {
namespace {

std::vector<float> RandomFloats(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

template <typename T>
DeviceBuffer<T> Upload(Backend* backend, const std::vector<T>& host) {
  DeviceBuffer<T> buffer(backend, host.size());
  buffer.Upload(host.data(), host.size());
  return buffer;
}

template <typename T>
std::vector<T> Download(const DeviceBuffer<T>& buffer) {
  std::vector<T> host(buffer.size());
  buffer.Download(host.data(), host.size());
  return host;
}

// SoftmaxCrossEntropy on `backend`, with logits, labels and dlogits in its memory; the summary is
// brought back to the host.
Backend::LossSummary Softmax(Backend* backend, const float* logits, const int32_t* labels, int rows,
                             int cols, float* dlogits) {
  DeviceBuffer<Backend::LossSummary> summary(backend, 1);
  backend->SoftmaxCrossEntropy(logits, labels, rows, cols, dlogits, summary.data());
  Backend::LossSummary host;
  summary.Download(&host, 1);
  return host;
}

// Expects |got - want| <= tolerance * max(|want|, scale) elementwise: a relative error, with
// `scale` (the data's typical magnitude) as the floor so values near zero do not demand an
// impossible relative accuracy.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, float tolerance,
                 float scale) {
  ASSERT_EQ(got.size(), want.size());
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float bound = tolerance * std::max(std::fabs(want[i]), scale);
    if (!(std::fabs(got[i] - want[i]) <= bound)) {
      ADD_FAILURE() << "element " << i << ": got " << got[i] << ", want " << want[i] << " (bound "
                    << bound << ")";
      if (++reported == 5) return;
    }
  }
}

// A CUDA backend in fp32 math and a CPU backend to compare it with. Skips without a GPU.
class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<int> count = CudaDeviceCount();
    ASSERT_TRUE(count.ok()) << count.status();
    if (*count == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
    gpu_ = MakeGpu("fp32");
    ASSERT_NE(gpu_, nullptr);
    cpu_ = MakeCpuBackend(1);
  }

  static std::unique_ptr<Backend> MakeGpu(const char* math) {
    ScopedEnv env("PS_CUDA_MATH", math);
    absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend(0);
    EXPECT_TRUE(backend.ok()) << backend.status();
    return backend.ok() ? std::move(*backend) : nullptr;
  }

  // Runs the same GEMM on `gpu` and the CPU and compares.
  void CheckGemm(Backend* gpu, bool ta, bool tb, int m, int n, int k, float alpha, float beta,
                 float tolerance) {
    SCOPED_TRACE(testing::Message() << gpu->Name() << " ta=" << ta << " tb=" << tb << " m=" << m
                                    << " n=" << n << " k=" << k);
    std::mt19937 rng(1234 + 2 * ta + tb);
    std::vector<float> a = RandomFloats(static_cast<size_t>(m) * k, rng);
    std::vector<float> b = RandomFloats(static_cast<size_t>(k) * n, rng);
    std::vector<float> c = RandomFloats(static_cast<size_t>(m) * n, rng);

    std::vector<float> want = c;
    cpu_->Gemm(ta, tb, m, n, k, alpha, a.data(), b.data(), beta, want.data());

    DeviceBuffer<float> da = Upload(gpu, a), db = Upload(gpu, b), dc = Upload(gpu, c);
    gpu->Gemm(ta, tb, m, n, k, alpha, da.data(), db.data(), beta, dc.data());
    ExpectClose(Download(dc), want, tolerance, 1.0f);
  }

  // Runs SoftmaxCrossEntropy on the GPU and the CPU and compares loss, hits and dlogits.
  void CheckSoftmax(const std::vector<float>& logits, const std::vector<int32_t>& labels, int rows,
                    int cols) {
    SCOPED_TRACE(testing::Message() << "rows=" << rows << " cols=" << cols);
    std::vector<float> want_d(logits.size());
    const Backend::LossSummary want =
        Softmax(cpu_.get(), logits.data(), labels.data(), rows, cols, want_d.data());

    DeviceBuffer<float> dx = Upload(gpu_.get(), logits);
    DeviceBuffer<int32_t> dy = Upload(gpu_.get(), labels);
    DeviceBuffer<float> dd(gpu_.get(), logits.size());
    const Backend::LossSummary got =
        Softmax(gpu_.get(), dx.data(), dy.data(), rows, cols, dd.data());
    EXPECT_NEAR(got.loss_sum, want.loss_sum, 1e-4 * std::max(1.0, std::fabs(want.loss_sum)));
    EXPECT_EQ(got.hits, want.hits);
    EXPECT_EQ(got.first_bad_row, want.first_bad_row);
    ExpectClose(Download(dd), want_d, 1e-4f, 1.0f / rows);

    // Loss only (no dlogits): the same summary, bit for bit (deterministic).
    const Backend::LossSummary again =
        Softmax(gpu_.get(), dx.data(), dy.data(), rows, cols, nullptr);
    EXPECT_EQ(again.loss_sum, got.loss_sum);
    EXPECT_EQ(again.hits, got.hits);
  }

  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<Backend> cpu_;
};

TEST_F(CudaBackendTest, GemmMatchesCpuForAllTransposes) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      CheckGemm(gpu_.get(), ta, tb, 37, 29, 53, 0.75f, -1.25f, 1e-4f);
      CheckGemm(gpu_.get(), ta, tb, 37, 29, 53, 1.0f, 0.0f, 1e-4f);
      CheckGemm(gpu_.get(), ta, tb, 1, 7, 300, -2.0f, 0.5f, 1e-4f);
    }
  }
}

// Tensor-core modes round inputs (tf32: 10-bit, bf16: 7-bit mantissa): loose bounds, which still
// catch wrong operands or layouts.
TEST_F(CudaBackendTest, GemmInTf32AndBf16IsClose) {
  std::unique_ptr<Backend> tf32 = MakeGpu("tf32");
  std::unique_ptr<Backend> bf16 = MakeGpu("bf16");
  ASSERT_NE(tf32, nullptr);
  ASSERT_NE(bf16, nullptr);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      CheckGemm(tf32.get(), ta, tb, 37, 29, 53, 0.75f, -1.25f, 1e-2f);
      CheckGemm(bf16.get(), ta, tb, 37, 29, 53, 0.75f, -1.25f, 5e-2f);
    }
  }
}

TEST_F(CudaBackendTest, AddBiasActivateMatchesCpu) {
  std::mt19937 rng(7);
  // The larger shape needs more blocks than the grid holds, so the grid-stride loop wraps.
  for (auto [rows, cols] : {std::pair{37, 29}, std::pair{1, 1}, std::pair{2049, 777}}) {
    for (bool relu : {false, true}) {
      SCOPED_TRACE(testing::Message() << rows << "x" << cols << " relu=" << relu);
      std::vector<float> z = RandomFloats(static_cast<size_t>(rows) * cols, rng);
      std::vector<float> bias = RandomFloats(cols, rng);
      std::vector<float> want = z;
      cpu_->AddBiasActivate(want.data(), bias.data(), rows, cols, relu);

      DeviceBuffer<float> dz = Upload(gpu_.get(), z), db = Upload(gpu_.get(), bias);
      gpu_->AddBiasActivate(dz.data(), db.data(), rows, cols, relu);
      EXPECT_EQ(Download(dz), want);  // one float add and a compare: bit-exact
    }
  }
}

TEST_F(CudaBackendTest, ReluBackwardMatchesCpu) {
  std::mt19937 rng(8);
  const int64_t n = 100003;
  std::vector<float> activation = RandomFloats(n, rng);
  for (float& a : activation) a = std::max(a, 0.0f);  // ReLU outputs: many exact zeros
  std::vector<float> dz = RandomFloats(n, rng);
  std::vector<float> want = dz;
  cpu_->ReluBackward(want.data(), activation.data(), n);

  DeviceBuffer<float> ddz = Upload(gpu_.get(), dz), da = Upload(gpu_.get(), activation);
  gpu_->ReluBackward(ddz.data(), da.data(), n);
  EXPECT_EQ(Download(ddz), want);
}

TEST_F(CudaBackendTest, ColumnSumMatchesCpu) {
  std::mt19937 rng(9);
  for (auto [rows, cols] :
       {std::pair{37, 29}, std::pair{1, 1}, std::pair{1000, 65}, std::pair{0, 3}}) {
    SCOPED_TRACE(testing::Message() << rows << "x" << cols);
    std::vector<float> x = RandomFloats(static_cast<size_t>(rows) * cols, rng);
    std::vector<float> want(cols);
    cpu_->ColumnSum(x.data(), rows, cols, want.data());

    DeviceBuffer<float> dx(gpu_.get(), std::max<size_t>(x.size(), 1));
    dx.Upload(x.data(), x.size());
    DeviceBuffer<float> dout = Upload(gpu_.get(), std::vector<float>(cols, 42.0f));
    gpu_->ColumnSum(dx.data(), rows, cols, dout.data());
    // Summation order differs from the CPU's: relative to the magnitude of a sum of rows terms.
    ExpectClose(Download(dout), want, 1e-4f, std::max(1.0f, std::sqrt(static_cast<float>(rows))));
  }
}

TEST_F(CudaBackendTest, SoftmaxCrossEntropyMatchesCpu) {
  std::mt19937 rng(10);
  // 13 columns: fewer than a warp; 1000: several per lane; 300 rows: more than one reduce pass.
  for (auto [rows, cols] :
       {std::pair{37, 13}, std::pair{300, 10}, std::pair{5, 1000}, std::pair{1, 1}}) {
    std::vector<float> logits = RandomFloats(static_cast<size_t>(rows) * cols, rng, -4.0f, 4.0f);
    std::vector<int32_t> labels(rows);
    std::uniform_int_distribution<int32_t> label(0, cols - 1);
    for (int32_t& y : labels) y = label(rng);
    CheckSoftmax(logits, labels, rows, cols);
  }
}

TEST_F(CudaBackendTest, SoftmaxArgmaxTiesPickTheFirstIndexLikeTheCpu) {
  const int rows = 40, cols = 70;
  std::vector<float> logits(rows * cols, 0.5f);  // every row is one long tie
  std::vector<int32_t> labels(rows);
  for (int r = 0; r < rows; ++r) labels[r] = r % 3 == 0 ? 0 : (r % 3 == 1 ? 33 : cols - 1);
  // A tie at two places in a row, the first one past the first warp-width of columns.
  logits[5 * cols + 40] = logits[5 * cols + 69] = 2.0f;
  labels[5] = 40;
  CheckSoftmax(logits, labels, rows, cols);
}

TEST_F(CudaBackendTest, SoftmaxGradientMayOverwriteTheLogits) {
  std::mt19937 rng(11);
  const int rows = 19, cols = 45;
  std::vector<float> logits = RandomFloats(rows * cols, rng, -4.0f, 4.0f);
  std::vector<int32_t> labels(rows);
  for (int r = 0; r < rows; ++r) labels[r] = (r * 7) % cols;
  std::vector<float> want(logits.size());
  const Backend::LossSummary want_summary =
      Softmax(cpu_.get(), logits.data(), labels.data(), rows, cols, want.data());

  DeviceBuffer<float> dx = Upload(gpu_.get(), logits);
  DeviceBuffer<int32_t> dy = Upload(gpu_.get(), labels);
  const Backend::LossSummary got = Softmax(gpu_.get(), dx.data(), dy.data(), rows, cols, dx.data());
  EXPECT_NEAR(got.loss_sum, want_summary.loss_sum, 1e-4 * std::max(1.0, want_summary.loss_sum));
  EXPECT_EQ(got.hits, want_summary.hits);
  ExpectClose(Download(dx), want, 1e-4f, 1.0f / rows);
}

TEST_F(CudaBackendTest, LabelsOutOfRangeAreReportedByRowLikeTheCpu) {
  std::mt19937 rng(12);
  const int rows = 70, cols = 10;
  std::vector<float> logits = RandomFloats(rows * cols, rng, -4.0f, 4.0f);
  std::vector<int32_t> labels(rows, 3);
  labels[66] = -1;
  labels[41] = cols;  // the first bad row
  CheckSoftmax(logits, labels, rows, cols);
  std::vector<float> d(logits.size());
  EXPECT_EQ(Softmax(cpu_.get(), logits.data(), labels.data(), rows, cols, d.data()).first_bad_row,
            41);
}

// The forward pass of a small layer recorded once and replayed on new inputs: each replay must
// compute on the data in the buffers at the time (not at recording), as the CPU does.
TEST_F(CudaBackendTest, RecordedWorkReplaysOnTheCurrentData) {
  const int rows = 33, in = 20, out = 12;
  std::mt19937 rng(13);
  std::vector<float> w = RandomFloats(in * out, rng), bias = RandomFloats(out, rng);
  std::vector<int32_t> labels(rows);
  for (int r = 0; r < rows; ++r) labels[r] = r % out;
  DeviceBuffer<float> dx(gpu_.get(), rows * in), dz(gpu_.get(), rows * out);
  DeviceBuffer<float> dw = Upload(gpu_.get(), w), db = Upload(gpu_.get(), bias);
  DeviceBuffer<int32_t> dy = Upload(gpu_.get(), labels);
  DeviceBuffer<Backend::LossSummary> summary(gpu_.get(), 1);
  std::unique_ptr<Backend::Recording> recording;
  int recorded = 0;
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(testing::Message() << "round " << round);
    std::vector<float> x = RandomFloats(rows * in, rng);
    std::vector<float> want(rows * out);
    cpu_->Gemm(false, false, rows, out, in, 1.0f, x.data(), w.data(), 0.0f, want.data());
    cpu_->AddBiasActivate(want.data(), bias.data(), rows, out, true);
    const Backend::LossSummary want_loss =
        Softmax(cpu_.get(), want.data(), labels.data(), rows, out, nullptr);

    dx.Upload(x.data(), x.size());
    gpu_->RunRecorded(&recording, [&] {
      ++recorded;
      gpu_->Gemm(false, false, rows, out, in, 1.0f, dx.data(), dw.data(), 0.0f, dz.data());
      gpu_->AddBiasActivate(dz.data(), db.data(), rows, out, true);
      gpu_->SoftmaxCrossEntropy(dz.data(), dy.data(), rows, out, nullptr, summary.data());
    });
    Backend::LossSummary got;
    summary.Download(&got, 1);
    ExpectClose(Download(dz), want, 1e-5f, 1.0f);
    EXPECT_NEAR(got.loss_sum, want_loss.loss_sum, 1e-4 * std::max(1.0, want_loss.loss_sum));
    EXPECT_EQ(got.hits, want_loss.hits);
  }
  EXPECT_EQ(recorded, 1)
      << "with graphs on (the default), the work is recorded once, then replayed";
  EXPECT_NE(recording, nullptr);
}

TEST_F(CudaBackendTest, WithoutGraphsRecordedWorkRunsEveryTime) {
  ScopedEnv env("PS_CUDA_GRAPHS", "0");
  absl::StatusOr<std::unique_ptr<Backend>> eager = MakeCudaBackend(0);
  ASSERT_TRUE(eager.ok()) << eager.status();
  std::unique_ptr<Backend::Recording> recording;
  int calls = 0;
  for (int i = 0; i < 3; ++i) (*eager)->RunRecorded(&recording, [&] { ++calls; });
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(recording, nullptr);
}

TEST_F(CudaBackendTest, AllocateZeroBytesGivesAPointer) {
  void* p = gpu_->Allocate(0);
  EXPECT_NE(p, nullptr);
  gpu_->Free(p);
}

TEST_F(CudaBackendTest, GatherRowsMatchesCpu) {
  std::mt19937 rng(21);
  const int count = 50, cols = 784, rows = 37;
  std::vector<float> features = RandomFloats(static_cast<size_t>(count) * cols, rng);
  std::vector<int32_t> labels(count), index(rows);
  for (int i = 0; i < count; ++i) labels[i] = i % 10;
  for (int r = 0; r < rows; ++r) index[r] = static_cast<int32_t>(rng() % count);
  std::vector<float> want(static_cast<size_t>(rows) * cols);
  std::vector<int32_t> want_labels(rows);
  cpu_->GatherRows(features.data(), index.data(), rows, cols * sizeof(float), want.data());
  cpu_->GatherRows(labels.data(), index.data(), rows, sizeof(int32_t), want_labels.data());
  DeviceBuffer<float> src = Upload(gpu_.get(), features), dst(gpu_.get(), want.size());
  DeviceBuffer<int32_t> src_labels = Upload(gpu_.get(), labels), idx = Upload(gpu_.get(), index),
                        dst_labels(gpu_.get(), rows);
  gpu_->GatherRows(src.data(), idx.data(), rows, cols * sizeof(float), dst.data());
  gpu_->GatherRows(src_labels.data(), idx.data(), rows, sizeof(int32_t), dst_labels.data());
  EXPECT_EQ(Download(dst), want);
  EXPECT_EQ(Download(dst_labels), want_labels);
}

TEST_F(CudaBackendTest, ConvolutionAndPoolingKernelsMatchCpu) {
  std::mt19937 rng(77);
  for (auto [kernel, stride, pad] : {std::tuple{5, 1, 2}, {3, 2, 0}, {4, 2, 1}}) {
    Backend::ConvShape s{.batch = 3,
                         .height = 9,
                         .width = 8,
                         .channels = 3,
                         .kernel = kernel,
                         .stride = stride,
                         .pad = pad};
    std::vector<float> x = RandomFloats(size_t{3} * 9 * 8 * 3, rng);
    std::vector<float> want_cols(s.rows() * s.cols()), c = RandomFloats(want_cols.size(), rng);
    std::vector<float> want_dx(x.size());
    cpu_->Im2Col(x.data(), s, want_cols.data());
    cpu_->Col2Im(c.data(), s, want_dx.data());
    DeviceBuffer<float> dx_in = Upload(gpu_.get(), x), dc = Upload(gpu_.get(), c);
    DeviceBuffer<float> cols(gpu_.get(), want_cols.size()), dx(gpu_.get(), x.size());
    gpu_->Im2Col(dx_in.data(), s, cols.data());
    gpu_->Col2Im(dc.data(), s, dx.data());
    EXPECT_EQ(Download(cols), want_cols) << "a copy: bit for bit";
    ExpectClose(Download(dx), want_dx, 1e-5f, 1.0f);
  }
  std::vector<float> x = RandomFloats(size_t{2} * 7 * 6 * 4, rng);
  const size_t n = size_t{2} * 3 * 3 * 4;
  std::vector<float> want_y(n), dy = RandomFloats(n, rng), want_dx(x.size());
  std::vector<int32_t> want_argmax(n);
  cpu_->MaxPool(x.data(), 2, 7, 6, 4, 2, want_y.data(), want_argmax.data());
  cpu_->MaxPoolBackward(dy.data(), want_argmax.data(), n, x.size(), want_dx.data());
  DeviceBuffer<float> dx_in = Upload(gpu_.get(), x), ddy = Upload(gpu_.get(), dy);
  DeviceBuffer<float> y(gpu_.get(), n), dx(gpu_.get(), x.size());
  DeviceBuffer<int32_t> argmax(gpu_.get(), n);
  gpu_->MaxPool(dx_in.data(), 2, 7, 6, 4, 2, y.data(), argmax.data());
  gpu_->MaxPoolBackward(ddy.data(), argmax.data(), n, x.size(), dx.data());
  EXPECT_EQ(Download(y), want_y);
  EXPECT_EQ(Download(argmax), want_argmax);
  EXPECT_EQ(Download(dx), want_dx);
}

TEST_F(CudaBackendTest, PinnedHostBuffersRoundTrip) {
  HostBuffer<float> host(gpu_.get(), 1000), back(gpu_.get(), 1000);
  for (int i = 0; i < 1000; ++i) host.data()[i] = 0.25f * i;
  DeviceBuffer<float> device(gpu_.get(), 1000);
  device.Upload(host.data(), 1000);
  device.Download(back.data(), 1000);
  EXPECT_EQ(std::vector<float>(back.data(), back.data() + 1000),
            std::vector<float>(host.data(), host.data() + 1000));
}

// Holds on every machine, so it never skips (deploy/gpu_run.sh fails a GPU run on any skip):
// devices that do not exist are an error, every device when there is no GPU, and device 0 works
// when there is one.
TEST(CudaBackendDeviceTest, OnlyDevicesThatExistCanBeUsed) {
  absl::StatusOr<int> counted = CudaDeviceCount();
  ASSERT_TRUE(counted.ok()) << counted.status();  // a machine with a driver too old would fail
  const int count = *counted;
  for (int device : {99, count, -1}) {  // with no GPU, `count` is device 0
    absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend(device);
    EXPECT_FALSE(backend.ok()) << "device " << device;
    EXPECT_NE(backend.status().message(), "");
    if (device == 0) std::cerr << "MakeCudaBackend(0) without a GPU: " << backend.status() << "\n";
  }
  if (count > 0) {
    absl::StatusOr<std::unique_ptr<Backend>> first = MakeCudaBackend(0);
    EXPECT_TRUE(first.ok()) << first.status();
  }
}

// PS_CUDA_MATH is checked before any device is touched, so this holds with or without a GPU.
TEST(CudaBackendDeviceTest, UnknownMathModeIsAnError) {
  ScopedEnv env("PS_CUDA_MATH", "fp8");
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend(0);
  ASSERT_FALSE(backend.ok());
  EXPECT_NE(std::string(backend.status().message()).find("PS_CUDA_MATH"), std::string::npos)
      << backend.status();
}

// A typo in the CUDA settings is an error for --device=auto too (with or without a GPU), not a
// silent fall back to the CPU.
TEST(CudaBackendDeviceTest, AutoRefusesABadCudaSetting) {
  for (const char* name : {"PS_CUDA_MATH", "PS_CUDA_GRAPHS"}) {
    ScopedEnv env(name, "fp8");
    for (const char* device : {"auto", "cuda"}) {
      absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(device, 1);
      ASSERT_FALSE(backend.ok()) << device;
      EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(std::string(backend.status().message()).find(name), std::string::npos)
          << backend.status();
    }
  }
}

// --device=auto takes the GPU where there is one, and the CPU (no error) where there is none.
TEST(CudaBackendDeviceTest, AutoTakesAGpuIfThereIsOneElseTheCpu) {
  absl::StatusOr<int> count = CudaDeviceCount();
  ASSERT_TRUE(count.ok()) << count.status();
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend("auto", 1);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->Name(), *count > 0 ? "cuda:0" : "cpu");
}

// Without an index, a process takes GPU (local rank mod GPUs); $LOCAL_RANK overrides the rank.
TEST(CudaBackendDeviceTest, TheLocalRankPicksTheGpu) {
  absl::StatusOr<int> count = CudaDeviceCount();
  ASSERT_TRUE(count.ok()) << count.status();
  for (const char* local_rank : {"", "3"}) {
    ScopedEnv env("LOCAL_RANK", local_rank);
    absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend("cuda", 1, /*rank=*/5);
    if (*count == 0) {
      EXPECT_FALSE(backend.ok());
      continue;
    }
    ASSERT_TRUE(backend.ok()) << backend.status();
    const int rank = *local_rank == '\0' ? 5 : 3;
    EXPECT_EQ((*backend)->Name(), "cuda:" + std::to_string(rank % *count));
  }
}

}  // namespace
}  // namespace ps
