// A training step that overlaps its communication with its compute (trainer/overlapped_step.h),
// against three shards served in the test's process over gRPC on 127.0.0.1: each shard's part of
// the gradient reaches its shard while backward is still computing the earlier layers, and the
// step's update is exactly the one of a step that did not overlap.
#include "trainer/overlapped_step.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/model_spec.h"
#include "kernels/backend.h"
#include "tests/in_process_shard.h"
#include "tests/run_dir.h"
#include "trainer/network.h"
#include "client/sharded_client.h"

namespace ps {
namespace {

constexpr int kShards = 3, kRows = 8, kExamples = 16;
constexpr float kLr = 0.5f;

// Four dense layers of about the same size over three shards, so that backward finishes shard
// 2's range after the third layer, shard 1's after the second and shard 0's after the first.
NetworkSpec Model() { return MlpNetwork({32, 32, 32, 32, 4}); }

class OverlappedStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = MakeCpuBackend(1);
    net_ = std::make_unique<Network>(Model(), kRows, backend_.get());
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0, 1);
    features_.resize(kExamples * 32);
    for (float& x : features_) x = normal(rng);
    for (int i = 0; i < kExamples; ++i) labels_.push_back(i % 4);
    net_->SetTrainingSet(features_.data(), labels_.data(), kExamples);
    for (int s = 0; s < kShards; ++s) {
      ShardServerConfig config = ShardOf(net_->Fingerprint(), 1, s, kShards);
      config.shard.optimizer.name = "sgd";
      config.shard.learning_rate.base = kLr;
      absl::StatusOr<std::unique_ptr<InProcessShard>> shard = InProcessShard::Start(config);
      ASSERT_TRUE(shard.ok()) << shard.status();
      addresses_.push_back((*shard)->address());
      shards_.push_back(*std::move(shard));
    }
  }
  ModelIdentity Identity() const { return {net_->Fingerprint(), net_->num_params(), kShards}; }
  int64_t VersionOf(int shard) { return Stats(addresses_[shard]).version(); }
  // Waits (up to a minute) for shard `shard` to reach version 1.
  bool Applied(int shard) {
    const absl::Time deadline = absl::Now() + absl::Minutes(1);
    while (VersionOf(shard) < 1) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Network> net_;
  std::vector<float> features_;
  std::vector<int32_t> labels_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<InProcessShard>> shards_;
};

TEST_F(OverlappedStepTest, EachPartIsPushedWhileBackwardGoesOnAndTheUpdateIsTheWholeStepsOne) {
  ShardedClient client(addresses_, Identity(), 0);
  ASSERT_TRUE(client.Register().ok());
  const std::vector<float> initial = net_->InitialParams(7);
  ASSERT_TRUE(client.Initialize(initial).ok());
  const int64_t n = net_->num_params();
  ASSERT_EQ(client.shard_range(2).begin, 2 * n / 3);
  const std::vector<TensorSlot>& t = net_->tensors();
  // Where backward reaches each shard's first element: after layers 3, 2 and 1 (of 4).
  ASSERT_LT(t[4].offset, client.shard_range(2).begin);
  ASSERT_GT(t[6].offset, client.shard_range(2).begin);
  ASSERT_LT(t[2].offset, client.shard_range(1).begin);
  ASSERT_GT(t[4].offset, client.shard_range(1).begin);

  std::vector<float> params(n), grad(n);
  const std::vector<int32_t> indices = {3, 1, 4, 1, 5, 9, 2, 6};
  OverlappedStep step(&client, client.StartPull(absl::MakeSpan(params)), grad);
  Network::LayerHooks hooks = step.Hooks();
  std::vector<int64_t> waited;
  Network::LayerHooks observed{
      .weights_needed =
          [&](int64_t end) {
            waited.push_back(end);
            return hooks.weights_needed(end);
          },
      .gradient_final =
          [&](int64_t begin) {
            absl::Status s = hooks.gradient_final(begin);
            if (begin == t[4].offset) {  // backward has not reached shards 0 and 1 yet
              EXPECT_TRUE(Applied(2)) << "shard 2's part was not pushed during backward";
              EXPECT_EQ(VersionOf(1), 0);
              EXPECT_EQ(VersionOf(0), 0);
            }
            if (begin == t[2].offset) {
              EXPECT_TRUE(Applied(1)) << "shard 1's part was not pushed during backward";
              EXPECT_EQ(VersionOf(0), 0);
            }
            return s;
          }};
  absl::StatusOr<float> loss = net_->GradientOfExamples(absl::MakeSpan(params), indices.data(),
                                                        kRows, absl::MakeSpan(grad), observed);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(params, initial);
  EXPECT_EQ(step.versions().version, (std::vector<int64_t>{0, 0, 0}));
  absl::StatusOr<ShardedClient::PushSummary> pushed = step.TakePush().Wait();
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->max_staleness, 0);
  EXPECT_EQ(pushed->sequence, 0);
  EXPECT_EQ(waited, (std::vector<int64_t>{t[2].offset, t[4].offset, t[6].offset, n}));

  // The same step computed whole gives the same loss and gradient, and the shards applied it.
  std::vector<float> whole(n);
  EXPECT_EQ(net_->GradientOfExamples(initial, indices.data(), kRows, absl::MakeSpan(whole)), *loss);
  EXPECT_EQ(whole, grad);
  std::vector<float> after(n);
  ASSERT_TRUE(client.Pull(absl::MakeSpan(after)).ok());
  for (int64_t i = 0; i < n; ++i) ASSERT_FLOAT_EQ(after[i], initial[i] - kLr * whole[i]) << i;
}

TEST_F(OverlappedStepTest, WithPrefetchTheNextPullStartsOnceThisOneArrived) {
  ShardedClient client(addresses_, Identity(), 0);
  ASSERT_TRUE(client.Register().ok());
  ASSERT_TRUE(client.Initialize(net_->InitialParams(7)).ok());
  const int64_t n = net_->num_params();
  std::vector<float> params(n), next(n), grad(n);
  const std::vector<int32_t> indices = {0, 1, 2, 3, 4, 5, 6, 7};
  ShardedClient::Pending<ShardedClient::Versions> prefetched;
  int pushes_started_before = -1;
  {
    OverlappedStep step(&client, client.StartPull(absl::MakeSpan(params)), grad,
                        {.pulled =
                             [&] {
                               pushes_started_before = static_cast<int>(VersionOf(2));
                               prefetched = client.StartPull(absl::MakeSpan(next), true);
                             },
                         .before_push = nullptr});
    ASSERT_TRUE(net_->GradientOfExamples(absl::MakeSpan(params), indices.data(), kRows,
                                         absl::MakeSpan(grad), step.Hooks())
                    .ok());
    ASSERT_TRUE(step.TakePush().Wait().ok());
  }
  EXPECT_EQ(pushes_started_before, 0);
  absl::StatusOr<ShardedClient::Versions> versions = prefetched.Wait();
  ASSERT_TRUE(versions.ok()) << versions.status();
  EXPECT_EQ(versions->version.size(), 3u);
}

TEST_F(OverlappedStepTest, AShardThatCannotBeReachedEndsTheStepAtItsLayerAndNothingIsPushed) {
  ClientOptions give_up_soon;
  give_up_soon.rpc_timeout = absl::Seconds(1);
  give_up_soon.retry_for = absl::Seconds(1);
  ShardedClient client(addresses_, Identity(), 0, give_up_soon);
  ASSERT_TRUE(client.Register().ok());
  ASSERT_TRUE(client.Initialize(net_->InitialParams(7)).ok());
  ASSERT_TRUE(shards_[1]->Stop().ok());  // shard 1 is gone; 0 and 2 serve
  const int64_t n = net_->num_params();
  std::vector<float> params(n), grad(n);
  const std::vector<int32_t> indices = {0, 1, 2, 3, 4, 5, 6, 7};
  OverlappedStep step(&client, client.StartPull(absl::MakeSpan(params)), grad);
  absl::StatusOr<float> loss = net_->GradientOfExamples(absl::MakeSpan(params), indices.data(),
                                                        kRows, absl::MakeSpan(grad), step.Hooks());
  ASSERT_FALSE(loss.ok());
  EXPECT_EQ(std::string(step.failed_call()), "pull");
  EXPECT_NE(loss.status().message().find(addresses_[1]), std::string::npos) << loss.status();
  EXPECT_EQ(VersionOf(0), 0);
  EXPECT_EQ(VersionOf(2), 0);
}

}  // namespace
}  // namespace ps
