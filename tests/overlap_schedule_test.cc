// The overlap schedule (client/overlap_schedule.h) as a framework's hooks drive it, against three
// shards served in the test's process: gradient ranges made final in any order (each shard's part
// goes once its range is all final), what a second backward would overwrite, and the weights
// waited for by range.
#include "client/overlap_schedule.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/model_spec.h"
#include "tests/in_process_shard.h"

namespace ps {
namespace {

constexpr int kShards = 3, kValues = 30;  // shard s holds [10 s, 10 s + 10)

class OverlapScheduleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int s = 0; s < kShards; ++s) {
      ShardServerConfig config = ShardOf(absl::StrCat("flat:", kValues), 1, s, kShards);
      config.shard.optimizer.name = "sgd";
      config.shard.learning_rate.base = 1;
      absl::StatusOr<std::unique_ptr<InProcessShard>> shard = InProcessShard::Start(config);
      ASSERT_TRUE(shard.ok()) << shard.status();
      addresses_.push_back((*shard)->address());
      shards_.push_back(*std::move(shard));
    }
    client_ = std::make_unique<ShardedClient>(addresses_, Identity(), 0);
    ASSERT_TRUE(client_->Register().ok());
    ASSERT_TRUE(client_->Initialize(std::vector<float>(kValues, 5)).ok());
  }
  ModelIdentity Identity() const {
    return *ParseModelSpec(absl::StrCat("flat:", kValues), kShards);
  }
  // The shards' values now, as an observer pulls them.
  std::vector<float> Values() {
    ShardedClient observer(addresses_, Identity(), -1);
    std::vector<float> values(kValues);
    EXPECT_TRUE(observer.Pull(absl::MakeSpan(values)).ok());
    return values;
  }
  // Waits (up to a minute) for shard `shard`'s values to become 5 - 1: the push applied there.
  bool Applied(int shard) {
    const absl::Time deadline = absl::Now() + absl::Minutes(1);
    while (Values()[10 * shard] != 4) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }

  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<InProcessShard>> shards_;
  std::unique_ptr<ShardedClient> client_;
};

TEST_F(OverlapScheduleTest, EachShardsPartGoesOnceItsRangeIsFinalInWhateverOrder) {
  std::vector<float> weights(kValues), grad(kValues, 1);
  OverlapSchedule step(client_.get(), client_->StartPull(absl::MakeSpan(weights)), grad);
  ASSERT_TRUE(step.WeightsNeeded(12, 18).ok());
  EXPECT_EQ(weights[15], 5);
  ASSERT_TRUE(step.WaitPull().ok());
  EXPECT_TRUE(step.pulled());
  EXPECT_FALSE(step.Final(0, kValues));

  // Shard 0's range first, in two pieces: nothing reaches the end, so only its part goes.
  ASSERT_TRUE(step.GradientFinal(4, 10).ok());
  ASSERT_TRUE(step.GradientFinal(0, 4).ok());
  EXPECT_EQ(step.filled_from(), kValues);
  ASSERT_TRUE(Applied(0));
  EXPECT_EQ(Values()[10], 5);
  EXPECT_EQ(Values()[20], 5);
  EXPECT_TRUE(step.Final(9, 11));
  EXPECT_FALSE(step.Final(10, 30));

  // The end: shard 2's part goes, told from 20 on.
  ASSERT_TRUE(step.GradientFinal(20, 30).ok());
  EXPECT_EQ(step.filled_from(), 20);
  ASSERT_TRUE(Applied(2));
  EXPECT_EQ(Values()[10], 5);

  // Shard 1's range joins both: everything is final from 0 on.
  ASSERT_TRUE(step.GradientFinal(10, 20).ok());
  EXPECT_EQ(step.filled_from(), 0);
  absl::StatusOr<ShardedClient::PushSummary> pushed = step.TakePush().Wait();
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->sequence, 0);
  EXPECT_EQ(Values(), std::vector<float>(kValues, 4));
}

TEST_F(OverlapScheduleTest, WeightsOutsideTheModelAreRefused) {
  std::vector<float> weights(kValues), grad(kValues);
  OverlapSchedule step(client_.get(), client_->StartPull(absl::MakeSpan(weights)), grad);
  EXPECT_EQ(step.WeightsNeeded(0, kValues + 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(step.WaitPull().ok());
}

}  // namespace
}  // namespace ps
