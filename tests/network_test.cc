// The network's tests (MLPs and CNNs) run on every backend this machine has: the CPU always, and
// CUDA (GPU 0) where the build has it and a GPU is there; none of them skips. MlpOnCudaTest
// compares the two. Also the model spec grammar (common/network_spec.h).
#include "trainer/network.h"

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/model_spec.h"
#include "tests/scoped_env.h"

namespace ps {
namespace {

// "cpu", plus "cuda" where a CUDA backend can start.
std::vector<std::string> AvailableBackends() {
  std::vector<std::string> names = {"cpu"};
  if (MakeBackend("cuda", 1).ok()) names.push_back("cuda");
  return names;
}

class NetworkOnBackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Backend>> made = MakeBackend(GetParam(), 1);
    ASSERT_TRUE(made.ok()) << made.status();
    backend_ = *std::move(made);
  }
  Backend* backend() { return backend_.get(); }

 private:
  std::unique_ptr<Backend> backend_;
};

INSTANTIATE_TEST_SUITE_P(Backends, NetworkOnBackendTest, ::testing::ValuesIn(AvailableBackends()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(MlpTest, LayoutNamesAndOffsets) {
  auto backend = MakeCpuBackend(1);
  Network mlp(MlpNetwork({784, 256, 128, 10}), 8, backend.get());
  EXPECT_EQ(mlp.num_params(), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  EXPECT_EQ(mlp.Fingerprint(), "mlp:784-256-128-10");
  ASSERT_EQ(mlp.tensors().size(), 6u);
  EXPECT_EQ(mlp.tensors()[0].name, "fc1.weight");
  EXPECT_EQ(mlp.tensors()[0].shape, (std::vector<int64_t>{784, 256}));  // [in, out]
  EXPECT_EQ(mlp.tensors()[1].offset, 784 * 256);
  EXPECT_EQ(mlp.tensors()[5].name, "fc3.bias");
}

TEST(MlpTest, HeInitialisationIsSeededAndScaled) {
  auto backend = MakeCpuBackend(1);
  Network mlp(MlpNetwork({784, 256, 10}), 8, backend.get());
  std::vector<float> a = mlp.InitialParams(7), b = mlp.InitialParams(7), c = mlp.InitialParams(8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  double sum_sq = 0;
  for (int64_t i = 0; i < 784 * 256; ++i) sum_sq += a[i] * a[i];
  EXPECT_NEAR(std::sqrt(sum_sq / (784 * 256)), std::sqrt(2.0 / 784), 0.002);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(a[784 * 256 + i], 0.0f);  // biases
}

// Each loss_at() call uploads new parameters into a step that, on CUDA, replays one recorded
// graph: the differences only come out right if every replay computes on the current values.
TEST_P(NetworkOnBackendTest, GradientMatchesFiniteDifferences) {
  const int rows = 5;
  Network mlp(MlpNetwork({6, 5, 4, 3}), rows, backend());
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> params = mlp.InitialParams(11), inputs(rows * 6);
  for (float& p : params) p += 0.1f * normal(rng);  // non-zero biases too
  for (float& x : inputs) x = normal(rng);
  std::vector<int32_t> labels = {0, 2, 1, 2, 0};
  std::vector<float> grad(mlp.num_params());
  mlp.Gradient(params, inputs.data(), labels.data(), rows, absl::MakeSpan(grad));

  std::vector<float> scratch(mlp.num_params());
  auto loss_at = [&](const std::vector<float>& p) {
    return mlp.Gradient(p, inputs.data(), labels.data(), rows, absl::MakeSpan(scratch));
  };
  const float eps = 1e-3f;  // small enough not to cross a ReLU kink
  for (int64_t i = 0; i < mlp.num_params(); ++i) {
    std::vector<float> plus = params, minus = params;
    plus[i] += eps;
    minus[i] -= eps;
    double numeric = (static_cast<double>(loss_at(plus)) - loss_at(minus)) / (2 * eps);
    EXPECT_NEAR(grad[i], numeric, 2e-3 + 2e-2 * std::abs(numeric)) << "parameter " << i;
  }
}

// A CNN with every kind of layer (same-padded and strided convolutions, pooling, dense layers):
// its gradient against finite differences, parameter by parameter.
TEST_P(NetworkOnBackendTest, CnnGradientMatchesFiniteDifferences) {
  const int rows = 4;
  absl::StatusOr<NetworkSpec> spec = ParseNetworkSpec("cnn:2x6x5-conv3k3-pool2-conv4k3s2p1-fc5-3");
  ASSERT_TRUE(spec.ok()) << spec.status();
  Network net(*spec, rows, backend());
  ASSERT_EQ(net.num_params(),
            (9 * 2 * 3 + 3) + (9 * 3 * 4 + 4) + (2 * 1 * 4 * 5 + 5) + (5 * 3 + 3));
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> params = net.InitialParams(13), inputs(rows * 6 * 5 * 2);
  for (float& p : params) p += 0.1f * normal(rng);
  for (float& x : inputs) x = normal(rng);
  std::vector<int32_t> labels = {2, 0, 1, 2};
  std::vector<float> grad(net.num_params()), scratch(net.num_params());
  net.Gradient(params, inputs.data(), labels.data(), rows, absl::MakeSpan(grad));
  auto loss_at = [&](const std::vector<float>& p) {
    return net.Gradient(p, inputs.data(), labels.data(), rows, absl::MakeSpan(scratch));
  };
  const float eps = 1e-3f;  // small enough not to cross a ReLU kink or change a tile's maximum
  for (int64_t i = 0; i < net.num_params(); ++i) {
    std::vector<float> plus = params, minus = params;
    plus[i] += eps;
    minus[i] -= eps;
    double numeric = (static_cast<double>(loss_at(plus)) - loss_at(minus)) / (2 * eps);
    EXPECT_NEAR(grad[i], numeric, 2e-3 + 2e-2 * std::abs(numeric)) << "parameter " << i;
  }
  // Evaluate scores the same loss as the training step.
  Network::Score score = net.Evaluate(params, inputs.data(), labels.data(), rows);
  EXPECT_NEAR(score.loss, loss_at(params), 1e-5);
}

TEST(NetworkSpecTest, SpecsParseToTheirCanonicalForm) {
  for (auto [spec, canonical, params] : std::vector<std::tuple<std::string, std::string, int64_t>>{
           {"mlp:784-256-128-10", "mlp:784-256-128-10", 784 * 256 + 256 + 256 * 128 + 128 + 1290},
           {"cnn:1x28x28-conv32k5-pool2-conv64k5-pool2-fc128-10",
            "cnn:1x28x28-conv32k5-pool2-conv64k5-pool2-fc128-10",
            (25 * 32 + 32) + (25 * 32 * 64 + 64) + (7 * 7 * 64 * 128 + 128) + (128 * 10 + 10)},
           {"cnn:1x28x28-conv8k3s1p1-10", "cnn:1x28x28-conv8k3-10",
            9 * 8 + 8 + 28 * 28 * 8 * 10 + 10},
           {"cnn:3x8x8-conv4-conv4k2s2p0-10", "cnn:3x8x8-conv4k3-conv4k2s2p0-10",
            (27 * 4 + 4) + (16 * 4 + 4) + (4 * 4 * 4 * 10 + 10)}}) {
    absl::StatusOr<NetworkSpec> parsed = ParseNetworkSpec(spec);
    ASSERT_TRUE(parsed.ok()) << spec << ": " << parsed.status();
    EXPECT_EQ(parsed->ToString(), canonical);
    EXPECT_EQ(parsed->num_params(), params) << spec;
    ASSERT_TRUE(ParseNetworkSpec(canonical).ok());
    EXPECT_EQ(ParseNetworkSpec(canonical)->ToString(), canonical);
    EXPECT_EQ(ParseModelSpec(spec, 1)->total_params, params) << "the shard's count agrees";
  }
  EXPECT_EQ(ParseModelSpec("cnn:1x28x28-conv8k3s1p1-10", 1)->fingerprint, "cnn:1x28x28-conv8k3-10")
      << "a shard compares canonical fingerprints";
  EXPECT_EQ(MlpNetwork({784, 256, 128, 10}).ToString(), "mlp:784-256-128-10");
  EXPECT_EQ(MlpNetwork({4, 3, 2}).num_params(), ParseNetworkSpec("mlp:4-3-2")->num_params());
}

TEST(NetworkSpecTest, BadSpecsNameTheProblem) {
  for (auto [spec, why] : std::vector<std::pair<std::string, std::string>>{
           {"cnn:1x28x28-conv32k5-relu-10", "unknown layer 'relu'"},
           {"cnn:1x28x28-fc10-conv8-10", "is not convO[kK][sS][pP] before the dense layers"},
           {"cnn:1x28x28-fc10-pool2-10", "is not poolN before the dense layers"},
           {"cnn:1x4x4-conv8k9p0-10", "kernel larger than its input 4x4"},
           {"cnn:1x4x4-pool8-10", "window larger than its input 4x4"},
           {"cnn:28x28-conv8-10", "input '28x28' is not CxHxW"},
           {"cnn:1x28x28", "no classes"},
           {"cnn:1x28x28-conv0-10", "is not convO"},
           {"cnn:1x28x28-convk3-10", "is not convO"},
           {"cnn:1x28x28-conv8k3x-10", "is not convO"},
           {"mlp:784-0-10", "is not a positive number"},
           {"rnn:1-2", "not a network"},
           {"flat:21", "not a network"},
           {"cnn:1x65536x65536-conv1024-10", "wider than 2^31 - 1"},
           {"cnn:1x28x28-conv1k3p2147483647-10", "padding must be below the kernel"},
           {"cnn:100000x1x1-conv1k201p0-10", "kernel larger than its input"},
           {"cnn:60000x9x9-conv1k201p200-10", "wider than 2^31 - 1"}}) {
    absl::StatusOr<NetworkSpec> parsed = ParseNetworkSpec(spec);
    ASSERT_FALSE(parsed.ok()) << spec;
    EXPECT_NE(std::string(parsed.status().message()).find(why), std::string::npos)
        << spec << ": " << parsed.status();
  }
}

TEST(NetworkSpecTest, ClientsCheckTheDataAndTheBatchFit) {
  EXPECT_TRUE(ResolveModel("cnn-small", "")->FitsFashionMnist().ok());
  EXPECT_TRUE(ResolveModel("", "256,128")->FitsFashionMnist().ok());
  for (const char* other : {"cnn:1x64x64-10", "cnn:3x28x28-10", "cnn:1x28x28-5", "mlp:100-10"}) {
    absl::Status s = ParseNetworkSpec(other)->FitsFashionMnist();
    EXPECT_NE(std::string(s.message()).find("does not fit Fashion-MNIST"), std::string::npos)
        << other << ": " << s;
  }
  NetworkSpec wide = *ParseNetworkSpec("cnn:1x28x28-conv4096k5-10");
  EXPECT_TRUE(wide.FitsBatch(64).ok());
  EXPECT_NE(std::string(wide.FitsBatch(1000).message()).find("too large for batches of 1000"),
            std::string::npos);
  EXPECT_EQ(ParseModelSpec("mlp:784-0256-10", 1)->fingerprint, "mlp:784-256-10");
}

TEST(NetworkSpecTest, TensorsAreLaidOutLayerByLayer) {
  std::vector<TensorSlot> slots = TensorSlots(*ParseNetworkSpec("cnn:1x8x8-conv4k3-pool2-fc6-10"));
  std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"conv1.weight", {3, 3, 1, 4}}, {"conv1.bias", {4}},
      {"fc1.weight", {64, 6}},        {"fc1.bias", {6}},
      {"fc2.weight", {6, 10}},        {"fc2.bias", {10}}};
  ASSERT_EQ(slots.size(), want.size());
  int64_t offset = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    EXPECT_EQ(slots[i].name, want[i].first);
    EXPECT_EQ(slots[i].shape, want[i].second);
    EXPECT_EQ(slots[i].offset, offset);
    offset += slots[i].size;
  }
}

TEST_P(NetworkOnBackendTest, EvaluateCountsAccuracyOverBatches) {
  Network mlp(MlpNetwork({2, 2}), 3, backend());  // softmax regression; 7 rows = 3 batches
  // Weights pick class 0 when x0 > x1.
  std::vector<float> params = {10, -10, -10, 10, 0, 0};
  std::vector<float> inputs = {1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0};
  std::vector<int32_t> labels = {0, 1, 0, 1, 0, 0, 0};  // the 6th is wrong
  Network::Score s = mlp.Evaluate(params, inputs.data(), labels.data(), 7);
  EXPECT_NEAR(s.accuracy, 6.0 / 7.0, 1e-9);
  EXPECT_NEAR(s.loss, 20.0 / 7.0, 1e-3);  // one example at loss ~20, the rest ~0
}

TEST(MlpTest, LayerSizesFromFlag) {
  EXPECT_EQ(*MlpLayerSizes(784, "256,128", 10), (std::vector<int>{784, 256, 128, 10}));
  EXPECT_EQ(*MlpLayerSizes(784, "", 10), (std::vector<int>{784, 10}));
  EXPECT_FALSE(MlpLayerSizes(784, "256,x", 10).ok());
  EXPECT_FALSE(MlpLayerSizes(784, "0", 10).ok());
}

TEST(MlpTest, LayerSizesFromASpecInvertMlpSpec) {
  EXPECT_EQ(*ParseMlpSpec("mlp:784-256-128-10"), (std::vector<int>{784, 256, 128, 10}));
  EXPECT_EQ(MlpSpec(*ParseMlpSpec("mlp:4-3-2")), "mlp:4-3-2");
  EXPECT_NE(ParseMlpSpec("flat:6").status().message().find("not an mlp"), std::string::npos);
  EXPECT_FALSE(ParseMlpSpec("mlp:4").ok());
  EXPECT_FALSE(ParseMlpSpec("mlp:3000000000-2").ok());  // wider than an int
}

TEST_P(NetworkOnBackendTest, GradientOfExamplesGathersTheSameBatch) {
  const int rows = 4, count = 9;
  Network mlp(MlpNetwork({6, 5, 3}), rows, backend());
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> features(count * 6);
  for (float& x : features) x = normal(rng);
  std::vector<int32_t> labels = {0, 1, 2, 0, 1, 2, 0, 1, 2}, indices = {8, 0, 3, 3};
  std::vector<float> batch;
  std::vector<int32_t> batch_labels;
  for (int32_t i : indices) {
    batch.insert(batch.end(), features.begin() + i * 6, features.begin() + (i + 1) * 6);
    batch_labels.push_back(labels[i]);
  }
  std::vector<float> params = mlp.InitialParams(2), direct(mlp.num_params());
  float loss =
      mlp.Gradient(params, batch.data(), batch_labels.data(), rows, absl::MakeSpan(direct));
  mlp.SetTrainingSet(features.data(), labels.data(), count);
  // As a worker does it: parameters and gradient in the backend's host buffers (pinned on CUDA).
  HostBuffer<float> host_params(backend(), params.size()), gathered(backend(), params.size());
  std::copy(params.begin(), params.end(), host_params.data());
  EXPECT_EQ(mlp.GradientOfExamples(host_params.span(), indices.data(), rows, gathered.span()),
            loss);
  EXPECT_EQ(direct, std::vector<float>(gathered.data(), gathered.data() + gathered.size()));

  // A smaller batch (a step recorded separately on CUDA) and then the first size again.
  std::vector<float> first_two(mlp.num_params());
  float loss_two =
      mlp.Gradient(params, batch.data(), batch_labels.data(), 2, absl::MakeSpan(first_two));
  EXPECT_EQ(mlp.GradientOfExamples(host_params.span(), indices.data(), 2, gathered.span()),
            loss_two);
  EXPECT_EQ(first_two, std::vector<float>(gathered.data(), gathered.data() + gathered.size()));
  EXPECT_EQ(mlp.GradientOfExamples(host_params.span(), indices.data(), rows, gathered.span()),
            loss);
}

// Layer by layer (Network::LayerHooks), a CNN's step asks for its weights as prefixes in layer
// order and hands its gradient over as suffixes, last layer first, each final when announced; the
// loss and gradient are exactly the recorded step's. A hook's error ends the step with it.
TEST_P(NetworkOnBackendTest, AStepLayerByLayerAnnouncesFinalSuffixesAndMatchesTheWholeStep) {
  const int rows = 3, count = 5;
  Network cnn(*ParseNetworkSpec("cnn:1x6x6-conv2k3s1p1-pool2-fc4-3"), rows, backend());
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> features(count * 36);
  for (float& x : features) x = normal(rng);
  std::vector<int32_t> labels = {0, 1, 2, 1, 0}, indices = {4, 1, 2};
  cnn.SetTrainingSet(features.data(), labels.data(), count);
  const int64_t n = cnn.num_params();
  HostBuffer<float> params(backend(), n), whole(backend(), n), layered(backend(), n);
  std::vector<float> initial = cnn.InitialParams(4);
  std::copy(initial.begin(), initial.end(), params.data());
  const float loss = cnn.GradientOfExamples(params.span(), indices.data(), rows, whole.span());

  std::vector<int64_t> ends, begins;
  std::fill(layered.data(), layered.data() + n, NAN);
  Network::LayerHooks hooks{.weights_needed =
                                [&](int64_t end) {
                                  ends.push_back(end);
                                  return absl::OkStatus();
                                },
                            .gradient_final =
                                [&](int64_t begin) {
                                  begins.push_back(begin);
                                  for (int64_t i = begin; i < n; ++i) {
                                    EXPECT_EQ(layered.data()[i], whole.data()[i]) << i;
                                  }
                                  return absl::OkStatus();
                                }};
  absl::StatusOr<float> layered_loss =
      cnn.GradientOfExamples(params.span(), indices.data(), rows, layered.span(), hooks);
  ASSERT_TRUE(layered_loss.ok()) << layered_loss.status();
  EXPECT_EQ(*layered_loss, loss);
  // Tensors: conv weight, bias; fc4 weight, bias; output weight, bias (pooling has none).
  const std::vector<TensorSlot>& t = cnn.tensors();
  ASSERT_EQ(t.size(), 6u);
  EXPECT_EQ(ends, (std::vector<int64_t>{t[2].offset, t[4].offset, n}));
  EXPECT_EQ(begins, (std::vector<int64_t>{t[4].offset, t[2].offset, 0}));
  EXPECT_EQ(std::vector<float>(whole.data(), whole.data() + n),
            std::vector<float>(layered.data(), layered.data() + n));

  // A hook that fails: the step ends with its error, and the network still works afterwards.
  hooks.gradient_final = [](int64_t) { return absl::UnavailableError("shard 1 is gone"); };
  EXPECT_EQ(
      cnn.GradientOfExamples(params.span(), indices.data(), rows, layered.span(), hooks).status(),
      absl::UnavailableError("shard 1 is gone"));
  hooks.weights_needed = [](int64_t) { return absl::CancelledError("stopping"); };
  EXPECT_EQ(cnn.GradientOfExamples(params.span(), indices.data(), rows, layered.span(), hooks)
                .status()
                .code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(cnn.GradientOfExamples(params.span(), indices.data(), rows, layered.span()), loss);
}

// The CUDA backend's gradient of the demo's model against the CPU's, on the same random batch:
// relative L2 error per GEMM math mode, printed (gpu_run.sh records them). FP32 is held to 1e-4;
// TF32 (10-bit mantissa) and BF16 (8-bit) inputs round, so their bounds are looser.
TEST(MlpOnCudaTest, GradientMatchesTheCpu) {
  if (!MakeBackend("cuda", 1).ok()) GTEST_SKIP() << "no usable CUDA GPU";
  const std::vector<int> sizes = {784, 256, 128, 10};
  const int rows = 256;
  auto cpu = MakeCpuBackend(1);
  Network reference(MlpNetwork(sizes), rows, cpu.get());
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> pixel(0, 1);
  std::vector<float> inputs(rows * sizes[0]);
  for (float& x : inputs) x = pixel(rng);
  std::vector<int32_t> labels(rows);
  for (int r = 0; r < rows; ++r) labels[r] = static_cast<int32_t>(rng() % 10);
  std::vector<float> params = reference.InitialParams(3), want(reference.num_params());
  const float want_loss =
      reference.Gradient(params, inputs.data(), labels.data(), rows, absl::MakeSpan(want));
  double want_norm = 0;
  for (float g : want) want_norm += static_cast<double>(g) * g;

  for (auto [math, bound] : {std::pair{"fp32", 1e-4}, {"tf32", 1e-2}, {"bf16", 5e-2}}) {
    SCOPED_TRACE(math);
    ScopedEnv env("PS_CUDA_MATH", math);
    absl::StatusOr<std::unique_ptr<Backend>> gpu = MakeBackend("cuda", 1);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    Network mlp(MlpNetwork(sizes), rows, gpu->get());
    std::vector<float> got(mlp.num_params());
    const float loss =
        mlp.Gradient(params, inputs.data(), labels.data(), rows, absl::MakeSpan(got));
    double diff = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      diff += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    }
    const double error = std::sqrt(diff / want_norm);
    std::cout << absl::StrFormat(
        "CUDA vs CPU gradient of mlp:784-256-128-10, batch %d, %s: relative L2 error %.3g "
        "(bound %.0e); loss %.7f vs %.7f\n",
        rows, math, error, bound, loss, want_loss);
    ::testing::Test::RecordProperty(std::string("relative_error_") + math, std::to_string(error));
    EXPECT_LT(error, bound);
    EXPECT_NEAR(loss, want_loss, 10 * bound * std::fabs(want_loss));
  }
}

}  // namespace
}  // namespace ps
