#include "server/state/parameter_shard.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"

namespace ps {
namespace {

const ModelIdentity kModel{"flat:10", 10, 2};
const ModelIdentity kModel3{"flat:3", 3, 1};

// The incarnation worker `id` got when it last registered (its pushes, heartbeats and Leave carry
// it).
int64_t Inc(const ParameterShard& shard, int id) {
  for (const WorkerSnapshot& w : shard.Stats().workers) {
    if (w.worker_id == id) return w.incarnation;
  }
  return 0;
}

std::vector<float> Values(const ParameterShard::Snapshot& s) {
  return std::vector<float>(s.values.span().begin(), s.values.span().end());
}

// A shard of `num_shards` of `model` (a spec) with plain SGD at rate `lr`, for 4 workers.
std::unique_ptr<ParameterShard> SgdShard(int index, int num_shards, float lr,
                                         const std::string& model) {
  ShardConfig c;
  c.shard_index = index;
  c.num_shards = num_shards;
  c.model = model;
  c.num_workers = 4;
  c.optimizer.name = "sgd";
  c.learning_rate.base = lr;
  return *ParameterShard::Create(c);
}

// Shard 1 of 2 over 10 parameters owns [5, 10), initialised to 5..9.
class ParameterShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(*shard_.Initialize(kModel, 5, Initial()));
    ASSERT_TRUE(shard_.Register(0, kModel).ok());
  }
  static std::vector<float> Initial() { return {5, 6, 7, 8, 9}; }
  std::vector<float> Weights() {
    return Values(*shard_.Read(kModel, -1, 0, 0, absl::InfiniteFuture()));
  }
  absl::StatusOr<PushOutcome> Push(int64_t sequence, int64_t base, int64_t offset,
                                   std::vector<float> g) {
    return shard_.Push({0, sequence, base, offset, static_cast<int64_t>(g.size()), Inc(shard_, 0)},
                       g);
  }
  std::unique_ptr<ParameterShard> owned_ = SgdShard(1, 2, 1.0f, "flat:10");
  ParameterShard& shard_ = *owned_;
};

TEST_F(ParameterShardTest, AppliesPushesAndCountsStaleness) {
  ASSERT_TRUE(Push(0, 0, 5, {1, 1, 1, 1, 1}).ok());
  absl::StatusOr<PushOutcome> second = Push(1, 0, 5, {2, 0, 2, 0, 0});  // computed from version 0
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->version, 2);
  EXPECT_EQ(second->staleness, 1);
  EXPECT_EQ(Weights(), (std::vector<float>{2, 5, 4, 7, 8}));
  ShardStats s = shard_.Stats();
  EXPECT_EQ(s.pushes_applied, 2);
  EXPECT_EQ(s.staleness_counts, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(s.range, (Range{5, 10}));
}

TEST_F(ParameterShardTest, RepeatedSequenceIsAppliedOnce) {
  ASSERT_TRUE(Push(3, 0, 5, {1, 1, 1, 1, 1}).ok());
  absl::StatusOr<PushOutcome> again = Push(3, 0, 5, {1, 1, 1, 1, 1});
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->duplicate);
  EXPECT_EQ(again->version, 1);
  EXPECT_EQ(Weights(), (std::vector<float>{4, 5, 6, 7, 8}));
  EXPECT_EQ(shard_.Register(0, kModel)->last_sequence, 3);
}

TEST_F(ParameterShardTest, RejectedPushesLeaveWeightsBitIdentical) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    PushHeaderInfo header;
    std::vector<float> gradient;
    absl::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases = {
      {{0, 0, 0, 5, 5},
       {1, 1, 1},
       absl::StatusCode::kInvalidArgument,
       "declares 5 values, carries 3"},
      {{0, 0, 0, 3, 2},
       {1, 1},
       absl::StatusCode::kInvalidArgument,
       "push covers [3, 5); a push must cover shard 1's whole range [5, 10)"},
      {{0, 0, 0, 9, 2}, {1, 1}, absl::StatusCode::kInvalidArgument, "whole range"},
      {{0, 0, 0, 7, 2}, {1, 1}, absl::StatusCode::kInvalidArgument, "whole range"},
      {{0, 0, 0, 5, 0}, {}, absl::StatusCode::kInvalidArgument, "whole range"},
      {{0, 0, 0, 5, 5}, {1, nan, 1, 1, 1}, absl::StatusCode::kInvalidArgument, "offset 6 is nan"},
      {{0, 0, 0, 5, 5}, {-inf, 1, 1, 1, 1}, absl::StatusCode::kInvalidArgument, "not finite"},
      {{0, 0, 4, 5, 5},
       {1, 1, 1, 1, 1},
       absl::StatusCode::kInvalidArgument,
       "base_version 4 is outside [0, 0]"},
      {{0, -1, 0, 5, 5}, {1, 1, 1, 1, 1}, absl::StatusCode::kInvalidArgument, "negative"},
      {{0, std::numeric_limits<int64_t>::max(), 0, 5, 5},
       {1, 1, 1, 1, 1},
       absl::StatusCode::kInvalidArgument,
       "is more than 1024 ahead of worker 0's last (-1)"},
      {{3, 0, 0, 5, 5},
       {1, 1, 1, 1, 1},
       absl::StatusCode::kFailedPrecondition,
       "worker 3 has not registered"},
      {{9, 0, 0, 5, 5},
       {1, 1, 1, 1, 1},
       absl::StatusCode::kInvalidArgument,
       "worker id 9 is outside this job's [0, 4)"},
  };
  std::vector<float> before = Weights();
  for (Case& c : cases) {
    c.header.incarnation = Inc(shard_, c.header.worker_id);
    absl::StatusOr<PushOutcome> r = shard_.Push(c.header, c.gradient);
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    EXPECT_NE(r.status().message().find(c.message), std::string::npos) << r.status();
    std::vector<float> after = Weights();
    EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0);
  }
  EXPECT_EQ(shard_.Stats().pushes_rejected, static_cast<int64_t>(cases.size()));
  EXPECT_EQ(shard_.Stats().version, 0);
}

TEST_F(ParameterShardTest, InitialisesOnceAndChecksTheModel) {
  EXPECT_FALSE(*shard_.Initialize(kModel, 5, {0, 0, 0, 0, 0}));  // a restarted initialiser
  EXPECT_EQ(Weights(), Initial());
  ModelIdentity other{"flat:12", 12, 2};
  EXPECT_EQ(shard_.Register(1, other).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(shard_.Register(1, other).status().message().find("model mismatch"), std::string::npos);
  ModelIdentity three_shards{"flat:10", 10, 3};
  EXPECT_NE(shard_.Register(1, three_shards).status().message().find("3 shards"),
            std::string::npos);
}

TEST(ParameterShardInitTest, RejectsWrongRangeAndNonFiniteValues) {
  auto owned = SgdShard(0, 2, 0.1f, "flat:10");
  ParameterShard& shard = *owned;
  EXPECT_NE(shard.Initialize(kModel, 0, {1, 2, 3}).status().message().find("owns [0, 5)"),
            std::string::npos);
  EXPECT_FALSE(shard.Initialize(kModel, 0, {1, 2, NAN, 4, 5}).ok());
  EXPECT_EQ(shard.Read(kModel, -1, 0, 0, absl::Now()).status().code(),
            absl::StatusCode::kUnavailable);
  // The shard knows its model: an initialiser of another one is refused before any payload.
  ModelIdentity huge{"flat:1099511627776", int64_t{1} << 40, 2};
  EXPECT_NE(
      shard.BeginInitialize(huge, 0, int64_t{1} << 39).status().message().find("model mismatch"),
      std::string::npos);
}

TEST(ParameterShardInitTest, OneInitialisationPayloadAtATime) {
  auto shard = SgdShard(0, 1, 0.1f, "flat:3");
  {
    absl::StatusOr<ParameterShard::InitializeSlot> first = shard->BeginInitialize(kModel3, 0, 3);
    ASSERT_TRUE(first.ok() && first->needed());
    // A second stream is refused while one is open.
    EXPECT_EQ(shard->BeginInitialize(kModel3, 0, 3).status().code(),
              absl::StatusCode::kUnavailable);
  }
  // Given up (the first stream broke): the slot is free again.
  absl::StatusOr<ParameterShard::InitializeSlot> second = shard->BeginInitialize(kModel3, 0, 3);
  ASSERT_TRUE(second.ok());
  std::fill(second->values().begin(), second->values().end(), 2.0f);
  EXPECT_TRUE(*shard->Commit(*std::move(second)));
  // Initialised: a restarted initialiser is told so and sends nothing.
  absl::StatusOr<ParameterShard::InitializeSlot> late = shard->BeginInitialize(kModel3, 0, 3);
  ASSERT_TRUE(late.ok());
  EXPECT_FALSE(late->needed());
  EXPECT_FALSE(*shard->Commit(*std::move(late)));
  EXPECT_EQ(shard->Read(kModel3, -1, 0, 0, absl::Now())->values.span()[0], 2.0f);
}

TEST(ParameterShardInitTest, ReadWaitsForInitialisation) {
  auto owned = SgdShard(0, 1, 0.1f, "flat:3");
  ParameterShard& shard = *owned;
  ModelIdentity m{"flat:3", 3, 1};
  std::thread init([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(shard.Initialize(m, 0, {1, 2, 3}).ok());
  });
  absl::StatusOr<ParameterShard::Snapshot> s =
      shard.Read(m, -1, 0, 0, absl::Now() + absl::Seconds(10));
  init.join();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Values(*s), (std::vector<float>{1, 2, 3}));
}

TEST(ParameterShardInitTest, ShutdownWakesWaitingReads) {
  auto owned = SgdShard(0, 1, 0.1f, "flat:3");
  ParameterShard& shard = *owned;
  std::thread stop([&] {
    absl::SleepFor(absl::Milliseconds(50));
    shard.Shutdown();
  });
  EXPECT_EQ(
      shard.Read(ModelIdentity{"flat:3", 3, 1}, -1, 0, 0, absl::InfiniteFuture()).status().code(),
      absl::StatusCode::kUnavailable);
  stop.join();
}

TEST(ParameterShardConcurrencyTest, ConcurrentPushesAndPullsLoseNothing) {
  const int kWorkers = 4, kPushes = 500, kSize = 1000;
  auto owned = SgdShard(0, 1, 1.0f, "flat:1000");
  ParameterShard& shard = *owned;
  ModelIdentity m{"flat:1000", kSize, 1};
  ASSERT_TRUE(shard.Initialize(m, 0, std::vector<float>(kSize, 0.0f)).ok());
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_TRUE(shard.Register(w, m).ok());
    threads.emplace_back([&, w] {
      std::vector<float> g(kSize, 1.0f);
      for (int i = 0; i < kPushes; ++i) {
        absl::StatusOr<ParameterShard::Snapshot> s = shard.Read(m, w, 0, 0, absl::InfiniteFuture());
        ASSERT_TRUE(s.ok());
        // Every element of one snapshot has seen the same number of updates.
        ASSERT_EQ(s->values.span().front(), s->values.span().back());
        ASSERT_TRUE(shard.Push({w, i, s->version, 0, kSize, Inc(shard, w)}, g).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<float> w = Values(*shard.Read(m, -1, 0, 0, absl::InfiniteFuture()));
  for (float v : w) ASSERT_EQ(v, -kWorkers * kPushes);
  EXPECT_EQ(shard.Stats().version, kWorkers * kPushes);
}

}  // namespace
}  // namespace ps

namespace ps {
namespace {

// A one-shard cluster over 4 parameters initialised to zero, SGD with rate 1, `workers`
// registered, and the consistency settings given.
struct ConsistencyFixture {
  ConsistencyFixture(const std::string& consistency, int workers,
                     const std::function<void(ShardConfig&)>& tweak = nullptr) {
    ShardConfig c;
    c.model = model.fingerprint;
    c.num_workers = workers;  // all registered: rounds wait for the job's every worker
    c.optimizer.name = "sgd";
    c.learning_rate.base = 1.0f;
    c.consistency = consistency;
    if (tweak) tweak(c);
    shard = *ParameterShard::Create(c);
    EXPECT_TRUE(shard->Initialize(model, 0, {0, 0, 0, 0}).ok());
    for (int w = 0; w < workers; ++w) EXPECT_TRUE(shard->Register(w, model).ok());
  }
  absl::StatusOr<PushOutcome> Push(int worker, int64_t base, std::vector<float> g) {
    return shard->Push({worker, next_sequence[worker]++, base, 0, 4, Inc(*shard, worker)}, g);
  }
  // Whether `worker` may pull now (waits 50 ms at most).
  bool MayPull(int worker) {
    return shard->Read(model, worker, 0, 0, absl::Now() + absl::Milliseconds(50)).ok();
  }
  std::vector<float> Weights() { return Values(*shard->Read(model, -1, 0, 0, absl::Now())); }
  // A pull by `worker` whose values go straight into `out` (ReadRequest::copy_out), as a pull
  // through shared memory does; returns its (valueless) snapshot.
  ParameterShard::Snapshot ReadInto(int worker, std::vector<float>* out) {
    ParameterShard::ReadRequest r{model, worker, 0, 0, -1, absl::Now() + absl::Minutes(1)};
    r.copy_out = [out](absl::Span<const float> v) { out->assign(v.begin(), v.end()); };
    std::optional<absl::StatusOr<ParameterShard::Snapshot>> answer;
    shard->StartRead(std::move(r), [&](absl::StatusOr<ParameterShard::Snapshot> s) {
      answer.emplace(std::move(s));
    });
    EXPECT_TRUE(answer.has_value() && answer->ok());  // answered at once: initialised, async
    return std::move(**answer);
  }

  ModelIdentity model{"flat:4", 4, 1};
  std::unique_ptr<ParameterShard> shard;
  std::map<int, int64_t> next_sequence;
};

TEST(SyncTest, AveragesOneRoundAndHoldsPullsUntilItCloses) {
  ConsistencyFixture f("sync", 2);
  ASSERT_TRUE(f.Push(0, 0, {2, 2, 2, 2}).ok());
  EXPECT_EQ(f.Weights(), (std::vector<float>{0, 0, 0, 0}));  // waiting for worker 1
  EXPECT_FALSE(f.MayPull(0));
  EXPECT_TRUE(f.MayPull(1));
  absl::StatusOr<PushOutcome> closing = f.Push(1, 0, {4, 0, 4, 0});
  ASSERT_TRUE(closing.ok());
  EXPECT_EQ(closing->version, 1);
  EXPECT_EQ(f.Weights(), (std::vector<float>{-3, -1, -3, -1}));  // minus the mean
  EXPECT_TRUE(f.MayPull(0));
  EXPECT_EQ(f.shard->Stats().staleness_counts, (std::vector<int64_t>{2}));
}

TEST(SyncTest, BackupWorkersCloseTheRoundEarlyAndLatePushesAreDropped) {
  ConsistencyFixture f("sync", 3, [](ShardConfig& c) { c.backup_workers = 1; });
  ASSERT_TRUE(f.Push(0, 0, {1, 1, 1, 1}).ok());
  ASSERT_EQ(f.Push(1, 0, {3, 3, 3, 3})->version, 1);
  absl::StatusOr<PushOutcome> late = f.Push(2, 0, {100, 100, 100, 100});
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(late->dropped);
  EXPECT_EQ(f.Weights(), (std::vector<float>{-2, -2, -2, -2}));
  EXPECT_EQ(f.shard->Stats().pushes_dropped_late, 1);
}

TEST(SyncTest, ASecondGradientForTheSameRoundIsRejected) {
  ConsistencyFixture f("sync", 2);
  ASSERT_TRUE(f.Push(0, 0, {1, 1, 1, 1}).ok());
  EXPECT_EQ(f.Push(0, 0, {1, 1, 1, 1}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(f.shard->Stats().version, 0);
}

// easgd: a push is a worker's elastic difference alpha * (x_i - centre), added to the centre as
// it is, at once; the shard's optimizer and learning rate (momentum, 0.1 here) play no part.
TEST(EasgdTest, TheCentreAddsEachElasticDifferenceAsItComes) {
  ConsistencyFixture f("easgd:4,0.25", 2, [](ShardConfig& c) {
    c.optimizer.name = "momentum";
    c.learning_rate.base = 0.1f;
  });
  EXPECT_EQ(f.shard->consistency().Name(), "easgd:4,0.25");
  // Worker 0 at x = (4, 0, -4, 8) against the centre 0: diff = 0.25 * x.
  ASSERT_EQ(f.Push(0, 0, {1, 0, -1, 2})->version, 1);
  EXPECT_EQ(f.Weights(), (std::vector<float>{1, 0, -1, 2}));
  // Worker 1 computed its difference against version 0: applied at once, staleness 1.
  absl::StatusOr<PushOutcome> second = f.Push(1, 0, {0.5f, 0.5f, 0.5f, 0.5f});
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->staleness, 1);
  EXPECT_EQ(f.Weights(), (std::vector<float>{1.5f, 0.5f, -0.5f, 2.5f}));
  EXPECT_TRUE(f.MayPull(0));
  EXPECT_TRUE(f.MayPull(1));
}

TEST(EasgdTest, AlphaDefaultsToNineTenthsOverTheWorkers) {
  ConsistencyFixture f("easgd:8", 1, [](ShardConfig& c) { c.num_workers = 3; });
  EXPECT_EQ(f.shard->consistency().Name(), "easgd:8,0.3");
  EXPECT_EQ(f.shard->consistency().spec().period, 8);
}

TEST(EasgdTest, AChangeThatWouldOverflowAWeightIsRejectedAndChangesNothing) {
  ConsistencyFixture f("easgd:1,0.5", 1);
  const float big = std::numeric_limits<float>::max();
  ASSERT_TRUE(f.Push(0, 0, {big, 0, 0, 1}).ok());
  EXPECT_EQ(f.Push(0, 1, {1, 1, 1, 1}).status().code(), absl::StatusCode::kOk);
  EXPECT_EQ(f.Push(0, 2, {big, 1, 1, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.Weights(), (std::vector<float>{big + 1, 1, 1, 2}));
  EXPECT_EQ(f.shard->Stats().version, 2);
  EXPECT_EQ(f.shard->Stats().updates_nonfinite, 1);
}

TEST(EasgdTest, GradientOnlySettingsAreRefused) {
  ShardConfig c;
  c.model = "flat:4";
  c.consistency = "easgd:4";
  c.dc_lambda = 0.04f;
  EXPECT_NE(ParameterShard::Create(c).status().message().find("--dc_lambda"), std::string::npos);
  c.dc_lambda = 0;
  c.consistency = "local:0";
  EXPECT_NE(ParameterShard::Create(c).status().message().find("H must be"), std::string::npos);
}

// local: a push is a worker's change over its H local steps; the round adds their average to
// the weights (the average of the workers' models, which all started from these weights), and a
// worker's next pull waits for it.
TEST(LocalSgdTest, ARoundAddsTheAverageChangeAndHoldsPullsUntilItCloses) {
  ConsistencyFixture f("local:5", 2, [](ShardConfig& c) { c.optimizer.name = "adam"; });
  ASSERT_TRUE(f.Push(0, 0, {2, 2, -2, 0}).ok());
  EXPECT_EQ(f.Weights(), (std::vector<float>{0, 0, 0, 0}));  // waiting for worker 1
  EXPECT_FALSE(f.MayPull(0));
  absl::StatusOr<PushOutcome> closing = f.Push(1, 0, {4, 0, 0, 1});
  ASSERT_TRUE(closing.ok());
  EXPECT_EQ(closing->version, 1);
  EXPECT_EQ(f.Weights(), (std::vector<float>{3, 1, -1, 0.5f}));  // plus the mean
  EXPECT_TRUE(f.MayPull(0));
  // A change computed from version 0 after the round closed without it is dropped, as under sync.
  absl::StatusOr<PushOutcome> late = f.Push(0, 0, {100, 100, 100, 100});
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(late->dropped);
  EXPECT_EQ(f.Weights(), (std::vector<float>{3, 1, -1, 0.5f}));
}

TEST(SyncTest, AnExpiredLeaseLeavesTheBarrierAndHeartbeatsBringTheWorkerBack) {
  ConsistencyFixture f("sync", 2, [](ShardConfig& c) { c.lease = absl::Milliseconds(200); });
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(f.Push(0, 0, {2, 2, 2, 2}).ok());  // refreshes worker 0 only
  EXPECT_EQ(f.shard->Stats().version, 0);
  EXPECT_EQ(f.shard->ExpireLeases(MonotonicNow()), (std::vector<int>{1}));
  EXPECT_EQ(f.shard->Stats().version, 1);  // the round closed without worker 1
  EXPECT_EQ(f.shard->Stats().active_workers, 1);
  EXPECT_EQ(*f.shard->Heartbeat(1, Inc(*f.shard, 1)), 2);
  ASSERT_TRUE(f.Push(1, 1, {2, 2, 2, 2}).ok());
  EXPECT_EQ(f.shard->Stats().version, 1);  // now the round waits for both again
}

TEST(SyncTest, AWorkerThatLeavesClosesTheRoundWaitingForIt) {
  ConsistencyFixture f("sync", 2);
  ASSERT_TRUE(f.Push(0, 0, {2, 2, 2, 2}).ok());
  ASSERT_TRUE(f.shard->Leave(1, Inc(*f.shard, 1)).ok());
  EXPECT_EQ(f.shard->Stats().version, 1);
  EXPECT_EQ(f.shard->Stats().active_workers, 1);
  EXPECT_EQ(f.shard->Leave(7, 0).code(), absl::StatusCode::kInvalidArgument);  // not in the job
}

// Four workers' gradients whose float sum depends on the order they are added in (1e8 + 1 is
// 1e8 in float).
const std::vector<std::vector<float>> kOrderSensitive = {
    {1e8f, 1, 3, 0.1f}, {1, 1e8f, -1e8f, 0.2f}, {-1e8f, -1e8f, 1e8f, 0.3f}, {1, 3, 1, 0.7f}};

// The weights after two sync rounds of kOrderSensitive (SGD, rate 1, from 0): the first with the
// pushes arriving in `order`, the second in the reverse order.
std::vector<float> WeightsAfterRoundsIn(const std::vector<int>& order) {
  ConsistencyFixture f("sync", 4);
  for (int w : order) EXPECT_TRUE(f.Push(w, 0, kOrderSensitive[w]).ok());
  for (auto w = order.rbegin(); w != order.rend(); ++w) {
    EXPECT_TRUE(f.Push(*w, 1, kOrderSensitive[*w]).ok());
  }
  EXPECT_EQ(f.shard->Stats().version, 2);
  return f.Weights();
}

// A round sums its gradients in rank order whatever order they arrive in: every arrival order
// gives the same bits, those of ((g0 + g1) + g2) + g3. (Summed as they arrived, the orders here
// give several different sums.)
TEST(SyncRankOrderTest, EveryArrivalOrderGivesTheBitsOfTheRankOrderedSum) {
  std::vector<float> expected(4);
  for (int i = 0; i < 4; ++i) {
    float sum = 0;
    for (const std::vector<float>& g : kOrderSensitive) sum += g[i];
    const float step = 1.0f * (sum * 0.25f);
    expected[i] = (0.0f - step) - step;
  }
  std::vector<int> order = {0, 1, 2, 3};
  std::set<std::vector<float>> arrival_sums;  // what summing in arrival order would give
  do {
    const std::vector<float> w = WeightsAfterRoundsIn(order);
    EXPECT_EQ(std::memcmp(w.data(), expected.data(), sizeof(float) * 4), 0)
        << "arrival order " << absl::StrJoin(order, ",") << ": " << absl::StrJoin(w, ",")
        << " vs " << absl::StrJoin(expected, ",");
    std::vector<float> sum(4, 0.0f);
    for (int id : order) {
      for (int i = 0; i < 4; ++i) sum[i] += kOrderSensitive[id][i];
    }
    arrival_sums.insert(sum);
  } while (std::next_permutation(order.begin(), order.end()));
  EXPECT_GT(arrival_sums.size(), 2u) << "the gradients must be ones whose sum depends on order";
}

// A push held for a lower rank is part of the round as far as checkpoints go: the saved sum has
// it folded in, and the restored round closes with the rest.
TEST(SyncRankOrderTest, AHalfGatheredRoundWithHeldPushesIsSavedWhole) {
  ConsistencyFixture f("sync", 3);
  ASSERT_TRUE(f.Push(2, 0, {4, 4, 4, 4}).ok());  // held: workers 0 and 1 may still push
  ASSERT_TRUE(f.Push(1, 0, {2, 2, 2, 2}).ok());  // held for worker 0
  ShardState state;
  ASSERT_TRUE(f.shard->Checkpoint(&state).ok());
  ASSERT_NE(state.Find(kRoundSumTensor), nullptr);
  EXPECT_EQ(*state.Find(kRoundSumTensor), (std::vector<float>{6, 6, 6, 6}));
  EXPECT_EQ(state.header.round_contributors_size(), 2);
  // Restored elsewhere (its workers with it: no waiting for them to register), and here: worker
  // 0's push closes both rounds alike.
  ConsistencyFixture restored("sync", 0, [](ShardConfig& c) { c.num_workers = 3; });
  ASSERT_TRUE(restored.shard->Restore(state).ok());
  for (ConsistencyFixture* shard : {&f, &restored}) {
    ASSERT_EQ(shard->Push(0, 0, {3, 3, 3, 3})->version, 1);
    EXPECT_EQ(shard->Weights(), (std::vector<float>{-3, -3, -3, -3}));  // minus the mean, 9 / 3
  }
}

// The push that completes an overflowing rank-ordered prefix is refused, whichever arrived first,
// and the round goes on without it.
TEST(SyncRankOrderTest, APushWhoseFoldWouldOverflowTheSumIsRefused) {
  ConsistencyFixture f("sync", 2);
  const float big = 3e38f;
  ASSERT_TRUE(f.Push(1, 0, {big, big, big, big}).ok());  // held for worker 0
  absl::StatusOr<PushOutcome> overflowing = f.Push(0, 0, {big, 0, 0, 0});
  EXPECT_EQ(overflowing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(overflowing.status().message().find("non-finite"), std::string::npos);
  EXPECT_EQ(f.shard->Stats().updates_nonfinite, 1);
  EXPECT_EQ(f.shard->Stats().version, 0);
  ASSERT_EQ(f.Push(0, 0, {-big, -big, -big, -big})->version, 1);
  EXPECT_EQ(f.Weights(), (std::vector<float>{0, 0, 0, 0}));
}

// A round-based job runs no round before all its workers have registered: a worker that starts
// first does not train alone. Its pull waits for the round; the late worker's registration alone
// does not close it, its push does.
TEST(RoundStartTest, NoRoundClosesBeforeEveryWorkerRegistered) {
  for (const char* consistency : {"sync", "local:4"}) {
    SCOPED_TRACE(consistency);
    ConsistencyFixture f(consistency, 1, [](ShardConfig& c) { c.num_workers = 2; });
    ASSERT_TRUE(f.Push(0, 0, {2, 2, 2, 2}).ok());
    std::optional<absl::StatusOr<ParameterShard::Snapshot>> pull;
    f.shard->StartRead({f.model, 0, 0, 0, -1, absl::Now() + absl::Minutes(5)},
                       [&](absl::StatusOr<ParameterShard::Snapshot> s) { pull.emplace(std::move(s)); });
    EXPECT_FALSE(pull.has_value());
    EXPECT_EQ(f.shard->Stats().version, 0);
    ASSERT_TRUE(f.shard->Register(1, f.model).ok());
    EXPECT_FALSE(pull.has_value());
    EXPECT_EQ(f.shard->Stats().version, 0);
    ASSERT_EQ(f.Push(1, 0, {4, 4, 4, 4})->version, 1);
    ASSERT_TRUE(pull.has_value() && pull->ok());
    EXPECT_EQ((*pull)->version, 1);
    const float mean = std::string(consistency) == "sync" ? -3 : 3;  // a gradient, or a change
    EXPECT_EQ(f.Weights(), (std::vector<float>{mean, mean, mean, mean}));
  }
}

// Backup workers let a round close without the slowest pushes, not without a worker that never
// started: the count to register is the whole job's.
TEST(RoundStartTest, BackupWorkersDoNotLowerTheCountToRegister) {
  ConsistencyFixture f("sync", 2, [](ShardConfig& c) {
    c.num_workers = 3;
    c.backup_workers = 1;
  });
  ASSERT_TRUE(f.Push(0, 0, {1, 1, 1, 1}).ok());
  ASSERT_TRUE(f.Push(1, 0, {3, 3, 3, 3}).ok());
  EXPECT_EQ(f.shard->Stats().version, 0);  // worker 2 has not registered
  ASSERT_TRUE(f.shard->Register(2, f.model).ok());
  EXPECT_EQ(f.shard->Stats().version, 1);  // 2 of 3 pushed: enough with one backup
  EXPECT_EQ(f.Weights(), (std::vector<float>{-2, -2, -2, -2}));
}

TEST(SspTest, AWorkerMayRunAtMostSClocksAheadOfTheSlowest) {
  ConsistencyFixture f("ssp:1", 2);
  EXPECT_TRUE(f.MayPull(0));
  ASSERT_TRUE(f.Push(0, 0, {1, 1, 1, 1}).ok());  // clocks 1, 0
  EXPECT_TRUE(f.MayPull(0));
  ASSERT_TRUE(f.Push(0, 1, {1, 1, 1, 1}).ok());  // clocks 2, 0: 2 - 1 > 0
  EXPECT_FALSE(f.MayPull(0));
  ASSERT_TRUE(f.Push(1, 0, {1, 1, 1, 1}).ok());  // clocks 2, 1
  EXPECT_TRUE(f.MayPull(0));
  EXPECT_EQ(f.shard->Stats().version, 3);  // every push applied at once
}

TEST(SspTest, ANewWorkerJoinsAtTheSlowestClock) {
  ConsistencyFixture f("ssp:0", 1, [](ShardConfig& c) { c.num_workers = 2; });
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(f.Push(0, i, {1, 1, 1, 1}).ok());
  ASSERT_TRUE(f.shard->Register(1, f.model).ok());
  EXPECT_TRUE(f.MayPull(0));  // worker 1 joined at clock 5, not 0
}

TEST(SspTest, AGradientFromBeforeALeaseExpiredIsDropped) {
  ConsistencyFixture f("ssp:1", 2, [](ShardConfig& c) { c.lease = absl::Milliseconds(100); });
  ASSERT_TRUE(f.MayPull(0));  // worker 0 pulls version 0, then goes silent
  absl::SleepFor(absl::Milliseconds(200));
  ASSERT_TRUE(f.Push(1, 0, {1, 1, 1, 1}).ok());  // refreshes worker 1 only
  ASSERT_EQ(f.shard->ExpireLeases(MonotonicNow()), (std::vector<int>{0}));
  for (int64_t v = 1; v < 20; ++v) ASSERT_TRUE(f.Push(1, v, {1, 1, 1, 1}).ok());
  absl::StatusOr<PushOutcome> late = f.Push(0, 0, {9, 9, 9, 9});  // staleness 20 > (W-1)(2S+1)
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(late->dropped);
  EXPECT_EQ(f.Weights(), (std::vector<float>{-20, -20, -20, -20}));
  EXPECT_FALSE(f.Push(0, 20, {1, 1, 1, 1})->dropped);  // computed after rejoining: applied
}

TEST(ModelCheckTest, AClientOfAnotherModelIsRefusedBeforeInitialisation) {
  auto shard = SgdShard(0, 1, 1.0f, "flat:100");
  ModelIdentity wrong{"mlp:784-32-10", 25450, 1};
  EXPECT_EQ(shard->Register(1, wrong).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->Stats().registered_workers, 0);
  EXPECT_EQ(shard->Read(wrong, 1, 0, 0, absl::Now()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(PolicyTest, StalenessAwareLearningRateDividesByStaleness) {
  ConsistencyFixture f("async", 2, [](ShardConfig& c) { c.staleness_aware_lr = true; });
  ASSERT_TRUE(f.Push(0, 0, {1, 1, 1, 1}).ok());
  ASSERT_TRUE(f.Push(0, 1, {1, 1, 1, 1}).ok());
  ASSERT_EQ(f.Push(1, 0, {4, 4, 4, 4})->staleness, 2);
  EXPECT_EQ(f.Weights(), (std::vector<float>{-4, -4, -4, -4}));  // -1 -1 -4/2
}

TEST(PolicyTest, PushesStalerThanTheBoundAreDropped) {
  ConsistencyFixture f("async", 2, [](ShardConfig& c) { c.max_staleness = 1; });
  ASSERT_TRUE(f.Push(0, 0, {1, 1, 1, 1}).ok());
  ASSERT_TRUE(f.Push(0, 1, {1, 1, 1, 1}).ok());
  absl::StatusOr<PushOutcome> stale = f.Push(1, 0, {9, 9, 9, 9});
  EXPECT_TRUE(stale->dropped);
  EXPECT_FALSE(f.Push(1, 1, {1, 1, 1, 1})->dropped);  // staleness 1 is within the bound
  EXPECT_EQ(f.Weights(), (std::vector<float>{-3, -3, -3, -3}));
  EXPECT_EQ(f.shard->Stats().pushes_dropped_stale, 1);
}

TEST(PolicyTest, DcAsgdCompensatesWithTheWeightsTheWorkerPulled) {
  ConsistencyFixture f("async", 2, [](ShardConfig& c) { c.dc_lambda = 0.5f; });
  ASSERT_TRUE(f.shard->Read(f.model, 1, 0, 0, absl::Now()).ok());  // worker 1 pulls w = 0
  ASSERT_TRUE(f.Push(0, 0, {1, 2, 0, 0}).ok());                    // w = -1 -2 0 0 (no pull: plain)
  ASSERT_TRUE(f.Push(1, 0, {2, 1, 1, 0}).ok());
  // g + 0.5 * g^2 * (w_now - w_pulled): 2 + 0.5*4*(-1) = 0, 1 + 0.5*1*(-2) = 0, 1, 0
  EXPECT_EQ(f.Weights(), (std::vector<float>{-1, -2, -1, 0}));
}

TEST(PolicyTest, ValuesCanGoStraightOutAndDcAsgdStillKeepsItsCopy) {
  ConsistencyFixture plain("async", 1);
  ASSERT_TRUE(plain.Push(0, 0, {1, 2, 3, 4}).ok());
  std::vector<float> out;
  ParameterShard::Snapshot s = plain.ReadInto(0, &out);
  EXPECT_EQ(out, (std::vector<float>{-1, -2, -3, -4}));
  EXPECT_TRUE(s.values.span().empty());  // no snapshot was copied
  EXPECT_EQ(s.version, 1);

  // The DC-ASGD case above, with worker 1's pull going straight out.
  ConsistencyFixture f("async", 2, [](ShardConfig& c) { c.dc_lambda = 0.5f; });
  ParameterShard::Snapshot pulled = f.ReadInto(1, &out);
  EXPECT_EQ(out, (std::vector<float>{0, 0, 0, 0}));
  EXPECT_EQ(Values(pulled), out);  // the shard's own copy, which compensation uses
  ASSERT_TRUE(f.Push(0, 0, {1, 2, 0, 0}).ok());
  ASSERT_TRUE(f.Push(1, 0, {2, 1, 1, 0}).ok());
  EXPECT_EQ(f.Weights(), (std::vector<float>{-1, -2, -1, 0}));
}

TEST(PolicyTest, LearningRateScalesWithActiveWorkers) {
  ConsistencyFixture f("async", 3, [](ShardConfig& c) { c.scale_lr_by_workers = true; });
  ASSERT_TRUE(f.Push(0, 0, {1, 1, 1, 1}).ok());
  EXPECT_EQ(f.Weights(), (std::vector<float>{-3, -3, -3, -3}));
}

TEST(ShardConfigTest, BadSettingsAreRejectedWithTheirName) {
  ShardConfig c;
  c.consistency = "ssp:-1";
  EXPECT_NE(ParameterShard::Create(c).status().message().find("unknown consistency model 'ssp:-1'"),
            std::string::npos);
  c.consistency = "bsp";
  EXPECT_FALSE(ParameterShard::Create(c).ok());
  c.consistency = "async";
  c.backup_workers = -1;
  EXPECT_FALSE(ParameterShard::Create(c).ok());
  c.backup_workers = 0;
  c.learning_rate.schedule = "linear";
  EXPECT_NE(ParameterShard::Create(c).status().message().find("'linear'"), std::string::npos);
  c.learning_rate.schedule = "constant";
  c.shard_index = 2;
  EXPECT_FALSE(ParameterShard::Create(c).ok());
}

}  // namespace
}  // namespace ps

namespace ps {
namespace {

// The hardening regressions: what one buggy or hostile client could do to a shard before.

ShardConfig Config(const std::string& optimizer, const std::string& consistency = "async") {
  ShardConfig c;
  c.model = "flat:4";
  c.num_workers = 2;  // Started registers both: rounds wait for the job's every worker
  c.optimizer.name = optimizer;
  c.learning_rate.base = 0.01f;
  c.consistency = consistency;
  return c;
}

// A shard of Config(...) initialised to 1, 2, 3, 4 with workers 0 and 1 registered (the
// two workers of Config's job).
std::unique_ptr<ParameterShard> Started(const ShardConfig& c) {
  std::unique_ptr<ParameterShard> shard = *ParameterShard::Create(c);
  EXPECT_TRUE(shard->Initialize({c.model, 4, 1}, 0, {1, 2, 3, 4}).ok());
  EXPECT_TRUE(shard->Register(0, {c.model, 4, 1}).ok());
  EXPECT_TRUE(shard->Register(1, {c.model, 4, 1}).ok());
  return shard;
}

std::vector<float> Weights(ParameterShard& shard) {
  return Values(*shard.Read({"flat:4", 4, 1}, -1, 0, 0, absl::Now()));
}

absl::StatusOr<PushOutcome> PushAll(ParameterShard& shard, int worker, int64_t sequence,
                                    float value) {
  int64_t version = shard.Stats().version;
  return shard.Push({worker, sequence, version, 0, 4, Inc(shard, worker)},
                    std::vector<float>(4, value));
}

TEST(NonFiniteUpdateTest, AFiniteHugeGradientCannotPoisonWeightsOrOptimizerState) {
  for (const char* optimizer : {"sgd", "momentum", "nesterov", "adam", "adagrad"}) {
    SCOPED_TRACE(optimizer);
    // `poisoned` gets 3e38 pushes until one is refused; `clean` the same accepted ones only.
    ShardConfig c = Config(optimizer);
    c.learning_rate.base = 1.0f;
    std::unique_ptr<ParameterShard> poisoned = Started(c);
    std::unique_ptr<ParameterShard> clean = Started(c);
    int64_t sequence = 0;
    absl::Status refused;
    for (; sequence < 5 && refused.ok(); ++sequence) {
      absl::StatusOr<PushOutcome> r = PushAll(*poisoned, 0, sequence, 3e38f);
      if (r.ok()) {
        ASSERT_TRUE(PushAll(*clean, 0, sequence, 3e38f).ok());
      } else {
        refused = r.status();
      }
    }
    ASSERT_FALSE(refused.ok()) << "3e38 pushes never overflowed";
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.message().find("non-finite"), std::string::npos) << refused;
    std::vector<float> before = Weights(*clean), after = Weights(*poisoned);
    EXPECT_EQ(std::memcmp(before.data(), after.data(), sizeof(float) * 4), 0);
    for (float w : after) EXPECT_TRUE(std::isfinite(w));
    ShardStats s = poisoned->Stats();
    EXPECT_EQ(s.updates_nonfinite, 1);
    EXPECT_EQ(s.version, clean->Stats().version);
    // The optimizer state is untouched too: the same next pushes have the same outcome and give
    // bit-identical weights. The refused sequence number is not used up.
    bool accepted = false;
    for (float next : {0.5f, -3e38f}) {
      absl::StatusOr<PushOutcome> a = PushAll(*poisoned, 0, sequence - 1, next);
      absl::StatusOr<PushOutcome> b = PushAll(*clean, 0, sequence - 1, next);
      EXPECT_EQ(a.ok(), b.ok()) << next;
      if ((accepted = b.ok())) break;
    }
    EXPECT_TRUE(accepted);
    before = Weights(*clean);
    after = Weights(*poisoned);
    EXPECT_EQ(std::memcmp(before.data(), after.data(), sizeof(float) * 4), 0);
  }
}

TEST(NonFiniteUpdateTest, SyncRefusesAnOverflowingSumAndDiscardsAPoisonedRound) {
  std::unique_ptr<ParameterShard> shard = Started(Config("momentum", "sync"));
  ASSERT_TRUE(PushAll(*shard, 0, 0, 3e38f).ok());
  // 3e38 + 3e38 overflows the round's sum: refused, and the round still waits for worker 1.
  EXPECT_EQ(PushAll(*shard, 1, 0, 3e38f).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->Stats().version, 0);
  // Averages of 1.5e38 are finite, but the third round's momentum (2.85e38 * 0.9 + 1.5e38) is
  // not: that round is discarded.
  std::unique_ptr<ParameterShard> second = Started(Config("momentum", "sync"));
  for (int64_t round = 0; round < 3; ++round) {
    ASSERT_TRUE(PushAll(*second, 0, round, 1.5e38f).ok());
    ASSERT_TRUE(PushAll(*second, 1, round, 1.5e38f).ok());
  }
  ShardStats s = second->Stats();
  EXPECT_EQ(s.updates_nonfinite, 1);
  EXPECT_EQ(s.version, 2);
  for (float w : Weights(*second)) EXPECT_TRUE(std::isfinite(w));
  // The workers were released from the discarded round and push for the same version again.
  EXPECT_TRUE(second->Read({"flat:4", 4, 1}, 0, 0, 0, absl::Now()).ok());
}

TEST(ClipNormTest, GradientsAboveTheNormAreScaledDownAndCounted) {
  ShardConfig c = Config("sgd");
  c.learning_rate.base = 1.0f;
  c.clip_norm = 1.0f;
  std::unique_ptr<ParameterShard> shard = Started(c);
  ASSERT_TRUE(
      shard->Push({0, 0, 0, 0, 4, Inc(*shard, 0)}, {3, 0, 4, 0}).ok());  // norm 5: scaled by 1/5
  EXPECT_EQ(Weights(*shard), (std::vector<float>{1 - 0.6f, 2, 3 - 0.8f, 4}));
  ASSERT_TRUE(
      shard->Push({0, 1, 1, 0, 4, Inc(*shard, 0)}, {0.5f, 0, 0, 0}).ok());  // norm 0.5: as is
  EXPECT_EQ(Weights(*shard), (std::vector<float>{1 - 0.6f - 0.5f, 2, 3 - 0.8f, 4}));
  EXPECT_EQ(shard->Stats().pushes_clipped, 1);
}

// ps --clip_norm_ratio: once the norm guard has a reference, a push above ratio x the reference
// (the middle of the workers' median norms) is scaled down to it and counted; a round's are not.
TEST(ClipNormTest, GradientsAboveTheRatioOfTheReferenceAreScaledDownToItAndCounted) {
  ShardConfig c = Config("sgd");
  c.learning_rate.base = 1.0f;
  c.num_workers = 3;
  c.clip_norm_ratio = 3;
  c.max_norm_ratio = 1000;
  std::unique_ptr<ParameterShard> shard = Started(c);
  ASSERT_TRUE(shard->Register(2, {c.model, 4, 1}).ok());
  int64_t sequence[3] = {0, 0, 0};
  auto push = [&](int worker, std::vector<float> g) {
    return shard->Push({worker, sequence[worker]++, shard->Stats().version, 0, 4,
                        Inc(*shard, worker)},
                       g);
  };
  for (int i = 0; i < NormGuard::kMinimum; ++i) {  // norm 1 from both workers: the reference
    ASSERT_TRUE(push(i % 2, {1, 0, 0, 0}).ok());
  }
  const std::vector<float> before = Weights(*shard);
  ASSERT_TRUE(push(2, {0, 300, 0, 400}).ok());  // norm 500: scaled to 3
  const std::vector<float> after = Weights(*shard);
  EXPECT_FLOAT_EQ(before[1] - after[1], 3 * 0.6f);
  EXPECT_FLOAT_EQ(before[3] - after[3], 3 * 0.8f);
  EXPECT_EQ(shard->Stats().pushes_clipped, 1);
  ASSERT_TRUE(push(2, {0, 0, 2.5f, 0}).ok());  // within 3x: as is
  EXPECT_FLOAT_EQ(after[2] - Weights(*shard)[2], 2.5f);
  EXPECT_EQ(shard->Stats().pushes_clipped, 1);
  absl::StatusOr<PushOutcome> absurd = push(2, {0, 0, 0, 2000});  // over 1000x: dropped
  ASSERT_TRUE(absurd.ok());
  EXPECT_TRUE(absurd->dropped);
  EXPECT_EQ(shard->Stats().pushes_dropped_norm, 1);
}

TEST(MembershipBoundsTest, WorkerIdsOutsideTheJobAreRefusedAndNothingIsKept) {
  std::unique_ptr<ParameterShard> shard = Started(Config("sgd"));
  for (int id : {4, 5, 666, 100000, std::numeric_limits<int>::max()}) {
    EXPECT_EQ(shard->Register(id, {"flat:4", 4, 1}).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(shard->Heartbeat(id, 0).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(shard->Leave(id, 0).code(), absl::StatusCode::kInvalidArgument);
  }
  // A flood of registrations costs nothing and changes nothing.
  absl::Time start = absl::Now();
  for (int id = 4; id < 100004; ++id) ASSERT_FALSE(shard->Register(id, {"flat:4", 4, 1}).ok());
  std::cout << "100,000 refused registrations took " << absl::Now() - start << "\n";
  ShardStats s = shard->Stats();
  EXPECT_EQ(s.registered_workers, 2);
  EXPECT_EQ(s.active_workers, 2);
}

TEST(MembershipBoundsTest, StatsListWorkersOnePageAtATime) {
  ShardConfig c = Config("sgd");
  c.num_workers = 600;
  std::unique_ptr<ParameterShard> shard = *ParameterShard::Create(c);
  for (int w = 0; w < 600; ++w) ASSERT_TRUE(shard->Register(w, {"flat:4", 4, 1}).ok());
  ShardStats first = shard->Stats();
  EXPECT_EQ(first.registered_workers, 600);
  ASSERT_EQ(first.workers.size(), static_cast<size_t>(ParameterShard::kMaxStatsWorkers));
  EXPECT_EQ(first.next_worker, ParameterShard::kMaxStatsWorkers);
  int seen = 0;
  for (int from = 0; from >= 0;) {
    ShardStats page = shard->Stats(from, 100);
    ASSERT_LE(page.workers.size(), 100u);
    for (const WorkerSnapshot& w : page.workers) EXPECT_EQ(w.worker_id, seen++);
    from = page.next_worker;
  }
  EXPECT_EQ(seen, 600);
  EXPECT_EQ(shard->Stats(0, 1'000'000).workers.size(),
            static_cast<size_t>(ParameterShard::kMaxStatsWorkers));
  ShardStats all = shard->AllStats();  // what the metrics and the statistics file report
  ASSERT_EQ(all.workers.size(), 600u);
  EXPECT_EQ(all.workers.back().worker_id, 599);
  EXPECT_EQ(all.next_worker, -1);
}

TEST(MembershipBoundsTest, AWorkerThatNeverPushesStopsBlockingSyncRounds) {
  ShardConfig c = Config("sgd", "sync");
  c.progress_timeout = absl::Milliseconds(100);
  std::unique_ptr<ParameterShard> shard = Started(c);
  ASSERT_TRUE(PushAll(*shard, 0, 0, 1).ok());  // the round waits for worker 1, which only beats
  absl::SleepFor(absl::Milliseconds(200));
  ASSERT_TRUE(shard->Heartbeat(1, Inc(*shard, 1)).ok());
  EXPECT_EQ(shard->ExpireLeases(MonotonicNow()), (std::vector<int>{1}));
  EXPECT_EQ(shard->Stats().version, 1);                // the round closed without it
  EXPECT_EQ(*shard->Heartbeat(1, Inc(*shard, 1)), 1);  // and heartbeats alone do not bring it back
  ASSERT_TRUE(PushAll(*shard, 0, 1, 1).ok());
  EXPECT_EQ(shard->Stats().version, 2);
  // Worker 0, waiting in its round, was never the one waited for: it stays.
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_TRUE(shard->ExpireLeases(MonotonicNow()).empty());
  // A push brings worker 1 back: rounds wait for both again.
  ASSERT_TRUE(PushAll(*shard, 1, 0, 1).ok());
  EXPECT_EQ(shard->Stats().active_workers, 2);
  ASSERT_TRUE(PushAll(*shard, 0, 2, 1).ok());
  EXPECT_EQ(shard->Stats().version, 3);
}

TEST(MembershipBoundsTest, AWorkerThatNeverPushesStopsHoldingTheSspMinimum) {
  ShardConfig c = Config("sgd", "ssp:0");
  c.progress_timeout = absl::Milliseconds(100);
  std::unique_ptr<ParameterShard> shard = Started(c);
  ASSERT_TRUE(PushAll(*shard, 0, 0, 1).ok());  // clocks 1, 0: worker 0 is held by worker 1
  EXPECT_FALSE(shard->Read({"flat:4", 4, 1}, 0, 0, 0, absl::Now()).ok());
  absl::SleepFor(absl::Milliseconds(200));
  ASSERT_TRUE(shard->Heartbeat(1, Inc(*shard, 1)).ok());
  EXPECT_EQ(shard->ExpireLeases(MonotonicNow()), (std::vector<int>{1}));
  EXPECT_TRUE(shard->Read({"flat:4", 4, 1}, 0, 0, 0, absl::Now()).ok());
}

TEST(DcAsgdMemoryTest, CopiesOnlyForActiveWorkersWholeShardPullsAndFreedOnLeave) {
  ShardConfig c = Config("sgd");
  c.dc_lambda = 0.5f;
  c.learning_rate.base = 1.0f;
  std::unique_ptr<ParameterShard> shard = Started(c);
  const ModelIdentity m{"flat:4", 4, 1};
  // A sub-range pull keeps nothing: the push after it is plain SGD.
  ASSERT_TRUE(shard->Read(m, 1, 1, 2, absl::Now()).ok());
  ASSERT_TRUE(PushAll(*shard, 0, 0, 1).ok());  // w = 0 1 2 3
  ASSERT_TRUE(shard->Push({1, 0, 0, 0, 4, Inc(*shard, 1)}, {2, 2, 2, 2}).ok());
  EXPECT_EQ(Weights(*shard), (std::vector<float>{-2, -1, 0, 1}));
  // A whole-shard pull is kept, and compensates the next push...
  ASSERT_TRUE(shard->Read(m, 1, 0, 0, absl::Now()).ok());  // at version 2: w = -2 -1 0 1
  ASSERT_TRUE(PushAll(*shard, 0, 1, 1).ok());              // w = -3 -2 -1 0
  ASSERT_TRUE(shard->Push({1, 1, 2, 0, 4, Inc(*shard, 1)}, {2, 0, 0, 0}).ok());
  // 2 + 0.5 * 4 * (-1) = 0: compensated to nothing.
  EXPECT_EQ(Weights(*shard), (std::vector<float>{-3, -2, -1, 0}));
  // ...until the worker leaves: its copies are freed, and a late push is applied plainly.
  ASSERT_TRUE(shard->Read(m, 1, 0, 0, absl::Now()).ok());  // version 4
  ASSERT_TRUE(shard->Leave(1, Inc(*shard, 1)).ok());
  ASSERT_TRUE(PushAll(*shard, 0, 2, 1).ok());  // w = -4 -3 -2 -1
  ASSERT_TRUE(shard->Push({1, 2, 4, 0, 4, Inc(*shard, 1)}, {2, 0, 0, 0}).ok());
  EXPECT_EQ(Weights(*shard), (std::vector<float>{-6, -3, -2, -1}));
}

TEST(SspPrefetchTest, APullAheadIsAdmittedAsIfThePendingPushWereDone) {
  std::unique_ptr<ParameterShard> shard = Started(Config("sgd", "ssp:1"));
  const ModelIdentity m{"flat:4", 4, 1};
  auto may_pull = [&](int worker, int64_t after_sequence) {
    return shard->Read(m, worker, 0, 0, absl::Now(), after_sequence).status().code();
  };
  ASSERT_TRUE(PushAll(*shard, 0, 0, 1).ok());  // clocks 1, 0
  // Worker 0 computes step 1 and prefetches step 2's weights: as if at clock 2, 2 - 1 > 0.
  EXPECT_EQ(may_pull(0, -1), absl::StatusCode::kOk);
  EXPECT_EQ(may_pull(0, 1), absl::StatusCode::kAborted);
  ASSERT_TRUE(PushAll(*shard, 1, 0, 1).ok());  // clocks 1, 1
  EXPECT_EQ(may_pull(0, 1), absl::StatusCode::kOk);
  ASSERT_TRUE(PushAll(*shard, 0, 1, 1).ok());  // clocks 2, 1: push 1 landed, nothing pending
  EXPECT_EQ(may_pull(0, 1), absl::StatusCode::kOk);
  EXPECT_EQ(may_pull(0, 2), absl::StatusCode::kAborted);
}

// A worker that pushes its last step and leaves does not close the round the others are still
// computing for: its gradient stays in the round, which waits for theirs and averages both.
TEST(SyncMembershipUnitTest, ALeavingContributorDoesNotCloseTheRoundForTheOthers) {
  ShardConfig c = Config("sgd", "sync");
  c.learning_rate.base = 1.0f;
  std::unique_ptr<ParameterShard> sync = Started(c);  // weights 1 2 3 4
  ASSERT_TRUE(PushAll(*sync, 0, 0, 2).ok());
  ASSERT_TRUE(sync->Leave(0, Inc(*sync, 0)).ok());
  EXPECT_EQ(sync->Stats().version, 0);
  absl::StatusOr<PushOutcome> last = PushAll(*sync, 1, 0, 4);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_FALSE(last->dropped);
  EXPECT_EQ(sync->Stats().version, 1);
  EXPECT_EQ(Weights(*sync), (std::vector<float>{-2, -1, 0, 1}));  // minus the mean, 3
}

TEST(SyncPrefetchTest, APullAheadWaitsForItsPushAndThenForTheRoundToClose) {
  std::unique_ptr<ParameterShard> sync = Started(Config("sgd", "sync"));
  const ModelIdentity m{"flat:4", 4, 1};
  auto may_pull = [&](int worker, int64_t after_sequence) {
    return sync->Read(m, worker, 0, 0, absl::Now(), after_sequence).status().code();
  };
  EXPECT_EQ(may_pull(0, -1), absl::StatusCode::kOk);
  EXPECT_EQ(may_pull(0, 0), absl::StatusCode::kAborted);  // push 0 not in: held
  // Held, it is answered by the push that closes the round, with that round's weights.
  std::optional<absl::StatusOr<int64_t>> held;  // the version it was answered with
  sync->StartRead({m, 0, 0, 0, /*after_sequence=*/0, absl::Now() + absl::Minutes(5)},
                  [&](absl::StatusOr<ParameterShard::Snapshot> s) {
                    held.emplace(s.ok() ? absl::StatusOr<int64_t>(s->version) : s.status());
                  });
  ASSERT_TRUE(PushAll(*sync, 0, 0, 1).ok());  // in, but its round waits for worker 1
  EXPECT_FALSE(held.has_value());
  EXPECT_EQ(may_pull(0, 0), absl::StatusCode::kAborted);
  ASSERT_TRUE(PushAll(*sync, 1, 0, 1).ok());  // the round closes
  ASSERT_TRUE(held.has_value());
  ASSERT_TRUE(held->ok()) << held->status();
  EXPECT_EQ(**held, 1);
  EXPECT_EQ(may_pull(0, 0), absl::StatusCode::kOk);
}

}  // namespace
}  // namespace ps

namespace ps {
namespace {

TEST(AsyncReadTest, HeldPullsWaitWithoutThreadsAndAreAnsweredByThePushThatAdmitsThem) {
  std::unique_ptr<ParameterShard> shard = Started(Config("sgd", "sync"));
  const ModelIdentity m{"flat:4", 4, 1};
  ASSERT_TRUE(PushAll(*shard, 0, 0, 1).ok());  // worker 0 waits for worker 1's gradient
  std::atomic<int> ok{0}, answered{0};
  std::vector<int64_t> tickets;
  for (int i = 0; i < 1000; ++i) {
    tickets.push_back(shard->StartRead({m, 0, 0, 0, -1, absl::Now() + absl::Minutes(5)},
                                       [&](absl::StatusOr<ParameterShard::Snapshot> s) {
                                         ok += s.ok() && s->version == 1;
                                         ++answered;
                                       }));
  }
  EXPECT_EQ(answered, 0);
  EXPECT_EQ(shard->Stats().pulls_waiting, 1000);
  shard->CancelRead(tickets[0]);  // answered at once, with CANCELLED
  EXPECT_EQ(answered, 1);
  ASSERT_TRUE(PushAll(*shard, 1, 0, 1).ok());  // closes the round: the push answers the rest
  EXPECT_EQ(answered, 1000);
  EXPECT_EQ(ok, 999);
  EXPECT_EQ(shard->Stats().pulls_waiting, 0);
  shard->CancelRead(tickets[1]);  // already answered: nothing happens
  EXPECT_EQ(answered, 1000);
}

TEST(AsyncReadTest, AWaitingPullIsAnsweredAtItsDeadlineAndShutdownEndsTheRest) {
  std::unique_ptr<ParameterShard> shard = *ParameterShard::Create(Config("sgd"));  // uninitialised
  const ModelIdentity m{"flat:4", 4, 1};
  absl::Notification answered, ended;
  absl::Time start = absl::Now();
  // Still not initialised at its deadline: UNAVAILABLE, which clients retry within their budget
  // (so nobody waits forever for an initialiser).
  shard->StartRead({m, -1, 0, 0, -1, start + absl::Milliseconds(100)},
                   [&](absl::StatusOr<ParameterShard::Snapshot> s) {
                     EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable);
                     EXPECT_NE(s.status().message().find("not initialised"), std::string::npos);
                     answered.Notify();
                   });
  shard->StartRead({m, -1, 0, 0, -1, start + absl::Hours(1)},
                   [&](absl::StatusOr<ParameterShard::Snapshot> s) {
                     EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable);
                     EXPECT_NE(s.status().message().find("shutting down"), std::string::npos);
                     ended.Notify();
                   });
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_FALSE(ended.HasBeenNotified());
  shard->Shutdown();
  EXPECT_TRUE(ended.HasBeenNotified());
}

}  // namespace
}  // namespace ps

namespace ps {
namespace {

TEST(FencingTest, ANewerProcessOfTheSameRankSupersedesTheOlder) {
  std::unique_ptr<ParameterShard> shard = Started(Config("sgd"));
  const int64_t old_incarnation = Inc(*shard, 0);
  absl::StatusOr<Registration> newer = shard->Register(0, {"flat:4", 4, 1});
  ASSERT_TRUE(newer.ok());
  EXPECT_GT(newer->incarnation, old_incarnation);
  // Before: two processes with one rank silently dropped each other's gradients as duplicates.
  absl::StatusOr<PushOutcome> stale =
      shard->Push({0, 0, 0, 0, 4, old_incarnation}, std::vector<float>(4, 1.0f));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.status().message().find("superseded by a newer process"), std::string::npos)
      << stale.status();
  EXPECT_EQ(shard->Heartbeat(0, old_incarnation).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->Leave(0, old_incarnation).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->Stats().version, 0);
  EXPECT_TRUE(shard->Push({0, 0, 0, 0, 4, newer->incarnation}, std::vector<float>(4, 1.0f)).ok());
  EXPECT_TRUE(shard->Heartbeat(0, newer->incarnation).ok());
}

}  // namespace
}  // namespace ps

namespace ps {
namespace {

// Pulls copy the values while pushes are applied on several threads: every snapshot is one
// version, whole (no push half applied), and its values are that version's.
TEST(ParameterShardConcurrencyTest, PullsNeverSeeAPushHalfApplied) {
  const int64_t n = 4 * ApplyThreads::kMinPart;
  ShardConfig c;
  c.model = absl::StrCat("flat:", n);
  c.num_workers = 1;
  c.learning_rate.base = 1.0f;
  c.apply_threads = 4;
  auto shard = *ParameterShard::Create(c);
  const ModelIdentity model{c.model, n, 1};
  ASSERT_TRUE(shard->Initialize(model, 0, std::vector<float>(n, 0.0f)).ok());
  ASSERT_TRUE(shard->Register(0, model).ok());
  const int64_t incarnation = Inc(*shard, 0);
  constexpr int kPushes = 60;
  std::atomic<bool> done{false};
  std::atomic<int> snapshots{0}, torn{0};
  auto reader = [&] {
    while (!done) {
      absl::StatusOr<ParameterShard::Snapshot> s =
          shard->Read(model, -1, 0, 0, absl::Now() + absl::Seconds(10));
      if (!s.ok()) continue;
      ++snapshots;
      for (float v : s->values.span()) {
        if (v != static_cast<float>(s->version)) {
          ++torn;
          break;
        }
      }
    }
  };
  std::thread r1(reader), r2(reader);
  for (int step = 0; step < kPushes; ++step) {
    // w -= 1 * (-1): every weight is the version.
    ASSERT_TRUE(shard->Push({0, step, step, 0, n, incarnation}, std::vector<float>(n, -1.0f)).ok());
  }
  done = true;
  r1.join();
  r2.join();
  EXPECT_EQ(torn, 0) << "of " << snapshots << " snapshots";
  EXPECT_GT(snapshots, 0);
  EXPECT_EQ(shard->version(), kPushes);
}

// NormGuard: a norm above ratio x the reference fails Check, from the 16th push applied on; alone,
// a worker's reference is the median of its own last 16.
TEST(NormGuardTest, RefusesNormsFarAboveTheRecentMedianOnceItHasSeenEnough) {
  NormGuard guard(1000);
  for (int i = 0; i < NormGuard::kMinimum - 1; ++i) {
    EXPECT_TRUE(guard.Check(0, 1e30).ok()) << "too few norms to judge by";
    guard.Accept(0, 1.0 + i % 3);  // median 2
  }
  EXPECT_TRUE(guard.Check(0, 1e30).ok());
  guard.Accept(0, 2);
  EXPECT_EQ(guard.reference(), 2);
  EXPECT_TRUE(guard.Check(0, 2000).ok());
  absl::Status refused = guard.Check(0, 2001);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("2001 is 1e+03 times the reference (2: the middle of 1 "
                                   "workers' median norms over their last 16 pushes applied)"),
            std::string::npos)
      << refused;
  // The window moves: 16 norms of 100 replace the old ones.
  for (int i = 0; i < NormGuard::kWindow; ++i) guard.Accept(0, 100);
  EXPECT_TRUE(guard.Check(0, 1e5).ok());
  EXPECT_FALSE(guard.Check(0, 1.1e5).ok());
  // Off, or nothing to judge by (all-zero pushes): anything passes.
  NormGuard off(0);
  for (int i = 0; i < 100; ++i) off.Accept(0, 1);
  EXPECT_TRUE(off.Check(0, 1e30).ok());
  NormGuard zeros(1000);
  for (int i = 0; i < 100; ++i) zeros.Accept(0, 0);
  EXPECT_TRUE(zeros.Check(0, 1).ok());
}

// The ratchet: a worker doubles its push's norm after each one applied and halves it after each
// drop, keeping under the bound. Before, its own pushes raised the median of the last 64 that
// bounded it, and its norm went from 0.05 to 1e11. Now, beside two workers pushing norms near 1,
// its vote is never the middle one: its pushes stay under ratio x theirs, however many it makes,
// and it cannot drag the reference down either.
TEST(NormGuardTest, OneWorkersOwnPushesCannotWalkTheReferenceUpOrDown) {
  NormGuard guard(1000);
  double attack = 0.05, largest_applied = 0;
  for (int step = 0; step < 400; ++step) {
    guard.Accept(0, 1.0 + 0.1 * (step % 5));
    guard.Accept(1, 0.8 + 0.1 * (step % 3));
    if (guard.Check(2, attack).ok()) {
      guard.Accept(2, attack);
      largest_applied = std::max(largest_applied, attack);
      attack *= 2;
    } else {
      attack /= 2;
    }
  }
  EXPECT_LE(largest_applied, 1000 * 1.4);
  EXPECT_GE(guard.reference(), 0.8);
  EXPECT_LE(guard.reference(), 1.4);
  // Tiny pushes as fast as it can: the others' pushes still pass.
  for (int i = 0; i < 1000; ++i) guard.Accept(2, 1e-12);
  EXPECT_GE(guard.reference(), 0.8);
  EXPECT_TRUE(guard.Check(0, 5).ok());
}

}  // namespace
}  // namespace ps
