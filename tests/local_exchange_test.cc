// A worker's side of local SGD and easgd (client/local_exchange.h) against two shards served in
// the test's process: when each exchange happens, what it pulls and pushes (values the shards
// end up holding, checked by hand), easgd's alpha as the shards named it, a pull that waits for a
// round to close, and shards that run no local models.
#include "client/local_exchange.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_spec.h"
#include "tests/in_process_shard.h"

namespace ps {
namespace {

using Floats = std::vector<float>;
constexpr int kShards = 2, kValues = 6;

class LocalExchangeTest : public ::testing::Test {
 protected:
  // Starts the shards under `consistency` for `workers` workers, initialised to 1, 2, ..., 6.
  void StartShards(const std::string& consistency, int workers) {
    for (int s = 0; s < kShards; ++s) {
      ShardServerConfig config = ShardOf(absl::StrCat("flat:", kValues), workers, s, kShards);
      config.shard.consistency = consistency;
      absl::StatusOr<std::unique_ptr<InProcessShard>> shard = InProcessShard::Start(config);
      ASSERT_TRUE(shard.ok()) << shard.status();
      addresses_.push_back((*shard)->address());
      shards_.push_back(*std::move(shard));
    }
    ShardedClient initialiser(addresses_, Identity(), -1);
    ASSERT_TRUE(initialiser.Register().ok());
    ASSERT_TRUE(initialiser.Initialize(Floats{1, 2, 3, 4, 5, 6}).ok());
  }
  ModelIdentity Identity() const {
    return *ParseModelSpec(absl::StrCat("flat:", kValues), kShards);
  }
  // A registered worker's client.
  std::unique_ptr<ShardedClient> Worker(int rank) {
    auto client = std::make_unique<ShardedClient>(addresses_, Identity(), rank);
    EXPECT_TRUE(client->Register().ok());
    return client;
  }
  // The centre the shards hold now.
  Floats Centre() {
    ShardedClient observer(addresses_, Identity(), -1);
    Floats centre(kValues);
    EXPECT_TRUE(observer.Pull(absl::MakeSpan(centre)).ok());
    return centre;
  }

  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<InProcessShard>> shards_;
};

TEST_F(LocalExchangeTest, LocalSgdStartsEachPeriodFromTheCentreAndPushesItsChangeAtItsEnd) {
  StartShards("local:2", 1);
  std::unique_ptr<ShardedClient> client = Worker(0);
  Floats x(kValues, 0);
  LocalModel model(absl::MakeSpan(x), 0);
  absl::StatusOr<std::unique_ptr<LocalExchange>> exchange =
      LocalExchange::Create(client.get(), &model);
  ASSERT_TRUE(exchange.ok()) << exchange.status();
  LocalExchange& e = **exchange;

  ASSERT_TRUE(e.BeforeStep(5).ok());  // the first exchange pulls, whatever the step
  EXPECT_TRUE(e.exchanged().pulled);
  EXPECT_EQ(x, (Floats{1, 2, 3, 4, 5, 6}));
  ASSERT_TRUE(e.AfterStep(5, /*last=*/false).ok());  // 6 % 2 == 0: the period's end
  EXPECT_TRUE(e.exchanged().pushed);
  EXPECT_EQ(e.exchanged().push.sequence, 5);
  EXPECT_EQ(Centre(), (Floats{1, 2, 3, 4, 5, 6}));  // no change yet

  ASSERT_TRUE(e.BeforeStep(6).ok());  // a period's start: the centre again
  EXPECT_TRUE(e.exchanged().pulled);
  model.Step(Floats{1, 1, 1, 1, 1, 1}, 0.5f);  // x - 0.5
  ASSERT_TRUE(e.AfterStep(6, false).ok());
  EXPECT_FALSE(e.exchanged().pushed);  // mid-period
  ASSERT_TRUE(e.BeforeStep(7).ok());
  EXPECT_FALSE(e.exchanged().pulled);
  model.Step(Floats{0, 0, 0, 0, 0, 2}, 0.5f);  // x[5] - 1
  ASSERT_TRUE(e.AfterStep(7, false).ok());
  EXPECT_TRUE(e.exchanged().pushed);
  EXPECT_EQ(e.exchanged().push.sequence, 7);
  // One worker's round: its change is the average.
  EXPECT_EQ(Centre(), (Floats{0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 4.5f}));

  ASSERT_TRUE(e.BeforeStep(8).ok());
  model.Step(Floats{2, 0, 0, 0, 0, 0}, 0.5f);       // x[0] - 1
  ASSERT_TRUE(e.AfterStep(8, /*last=*/true).ok());  // the run's last step ends its period
  EXPECT_TRUE(e.exchanged().pushed);
  EXPECT_EQ(Centre(), (Floats{-0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 4.5f}));
}

TEST_F(LocalExchangeTest, EasgdTradesTheElasticDifferenceWithTheShardsAlpha) {
  StartShards("easgd:2", 4);  // no alpha given: the shards' 0.9 / 4
  std::unique_ptr<ShardedClient> client = Worker(0);
  Floats x(kValues, 0);
  LocalModel model(absl::MakeSpan(x), 0);
  absl::StatusOr<std::unique_ptr<LocalExchange>> exchange =
      LocalExchange::Create(client.get(), &model);
  ASSERT_TRUE(exchange.ok()) << exchange.status();
  LocalExchange& e = **exchange;
  EXPECT_DOUBLE_EQ(e.spec().alpha, 0.225);

  ASSERT_TRUE(e.BeforeStep(3).ok());  // starting: the model is the centre
  EXPECT_TRUE(e.exchanged().pulled);
  EXPECT_FALSE(e.exchanged().pushed);
  EXPECT_EQ(x, (Floats{1, 2, 3, 4, 5, 6}));
  x = {5, 2, 3, 4, 5, 2};  // trained locally
  ASSERT_TRUE(e.AfterStep(3, true).ok());
  EXPECT_FALSE(e.exchanged().pushed);  // easgd pushes before steps only
  ASSERT_TRUE(e.BeforeStep(4).ok());
  EXPECT_TRUE(e.exchanged().pulled);
  EXPECT_TRUE(e.exchanged().pushed);
  EXPECT_EQ(e.exchanged().push.sequence, 4);
  // diff = 0.225 (x - centre) = (0.9, 0, 0, 0, 0, -0.9): x loses it, the centre gains it.
  const float d = static_cast<float>(0.225 * 4);
  EXPECT_EQ(x, (Floats{5 - d, 2, 3, 4, 5, 2 + d}));
  EXPECT_EQ(Centre(), (Floats{1 + d, 2, 3, 4, 5, 6 - d}));
  ASSERT_TRUE(e.BeforeStep(5).ok());  // 5 % 2 != 0
  EXPECT_FALSE(e.exchanged().pulled);
}

TEST_F(LocalExchangeTest, WaitReturnsWhileAPullWaitsForTheRoundToClose) {
  StartShards("local:1", 2);
  std::unique_ptr<ShardedClient> first = Worker(0), second = Worker(1);
  Floats x0(kValues), x1(kValues);
  LocalModel model0(absl::MakeSpan(x0), 0), model1(absl::MakeSpan(x1), 0);
  std::unique_ptr<LocalExchange> e0 = *LocalExchange::Create(first.get(), &model0);
  std::unique_ptr<LocalExchange> e1 = *LocalExchange::Create(second.get(), &model1);
  ASSERT_TRUE(e0->BeforeStep(0).ok());
  ASSERT_TRUE(e1->BeforeStep(0).ok());
  x0[0] += 2;
  ASSERT_TRUE(e0->AfterStep(0, false).ok());
  ASSERT_TRUE(e0->StartBeforeStep(1).ok());
  EXPECT_EQ(e0->Wait(absl::Milliseconds(200)), std::nullopt);  // worker 1's change is missing
  ASSERT_TRUE(e1->AfterStep(0, false).ok());
  std::optional<absl::Status> done = e0->Wait(absl::Seconds(30));
  ASSERT_TRUE(done.has_value());
  ASSERT_TRUE(done->ok()) << *done;
  EXPECT_EQ(x0, (Floats{2, 2, 3, 4, 5, 6}));  // the round's average change, (2 + 0) / 2
}

TEST_F(LocalExchangeTest, ShardsWithoutLocalModelsHaveNoExchange) {
  StartShards("async", 1);
  std::unique_ptr<ShardedClient> client = Worker(0);
  Floats x(kValues);
  LocalModel model(absl::MakeSpan(x), 0);
  absl::StatusOr<std::unique_ptr<LocalExchange>> exchange =
      LocalExchange::Create(client.get(), &model);
  EXPECT_EQ(exchange.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(exchange.status().message().find("async"), std::string::npos) << exchange.status();
}

TEST_F(LocalExchangeTest, AModelOfAnotherSizeIsRefused) {
  StartShards("local:2", 1);
  std::unique_ptr<ShardedClient> client = Worker(0);
  Floats small(kValues - 1);
  LocalModel model(absl::MakeSpan(small), 0);
  absl::StatusOr<std::unique_ptr<LocalExchange>> exchange =
      LocalExchange::Create(client.get(), &model);
  EXPECT_EQ(exchange.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
