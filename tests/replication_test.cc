// Replication (ps --peer): a backup repeating its primary's changes reaches the same state bit for
// bit; the primary's log acknowledges only what the backup applied; and real primaries killed
// (SIGKILL) or cut off (SIGSTOP) mid-run lose no acknowledged push, while the old primary
// acknowledges nothing afterwards.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "deploy/local_cluster.h"
#include "server/replication/replication_log.h"
#include "server/state/parameter_shard.h"
#include "tests/run_dir.h"
#include "client/sharded_client.h"

namespace ps {
namespace {

const ModelIdentity kFlat{"flat:8", 8, 1};

// Clipping, momentum, a staleness-aware rate, drops of stale pushes and SSP: every input to an
// update the backup must not recompute.
ShardConfig Config() {
  ShardConfig c;
  c.model = "flat:8";
  c.num_workers = 3;
  c.optimizer.name = "adam";
  c.learning_rate.base = 0.05f;
  c.learning_rate.schedule = "cosine";
  c.learning_rate.total_updates = 40;
  c.clip_norm = 1.5f;
  c.staleness_aware_lr = true;
  c.max_staleness = 3;
  c.consistency = "ssp:4";
  return c;
}

int64_t Incarnation(const ParameterShard& shard, int id) {
  for (const WorkerSnapshot& w : shard.Stats().workers) {
    if (w.worker_id == id) return w.incarnation;
  }
  return 0;
}

void ExpectSameState(const ParameterShard& a, const ParameterShard& b) {
  ShardState x, y;
  ASSERT_TRUE(a.Checkpoint(&x).ok());
  ASSERT_TRUE(b.Checkpoint(&y).ok());
  EXPECT_EQ(x.header.version(), y.header.version());
  EXPECT_EQ(x.header.changes(), y.header.changes());
  ASSERT_EQ(x.header.tensors_size(), y.header.tensors_size());  // values and optimizer slots
  for (int i = 0; i < x.header.tensors_size(); ++i) {
    const std::vector<float>& p = x.tensors[i];
    const std::vector<float>& q = y.tensors[i];
    ASSERT_EQ(x.header.tensors(i), y.header.tensors(i));
    ASSERT_EQ(p.size(), q.size());
    EXPECT_EQ(std::memcmp(p.data(), q.data(), p.size() * sizeof(float)), 0) << x.header.tensors(i);
  }
  ASSERT_EQ(x.header.workers_size(), y.header.workers_size());
  for (int i = 0; i < x.header.workers_size(); ++i) {
    EXPECT_EQ(x.header.workers(i).id(), y.header.workers(i).id());
    EXPECT_EQ(x.header.workers(i).last_sequence(), y.header.workers(i).last_sequence());
    EXPECT_EQ(x.header.workers(i).clock(), y.header.workers(i).clock());
    EXPECT_EQ(x.header.workers(i).pushes_applied(), y.header.workers(i).pushes_applied());
  }
}

// A backup fed every change from the start, and one that joins halfway (from the primary's
// state, then the changes after it), both end bit-identical to the primary.
TEST(ReplicatedShardTest, ABackupRepeatingThePrimarysChangesIsBitIdentical) {
  std::unique_ptr<ParameterShard> backup = *ParameterShard::Create(Config());
  std::unique_ptr<ParameterShard> late = *ParameterShard::Create(Config());
  bool late_joined = false;
  int updates = 0, taken = 0;
  std::unique_ptr<ParameterShard> primary = *ParameterShard::Create(Config());
  primary->SetChangeListener([&](const ShardChange& c) {
    updates += c.kind == ShardChange::Kind::kUpdate;
    taken += c.kind == ShardChange::Kind::kTaken;
    EXPECT_TRUE(backup->ApplyChange(c).ok());
    if (late_joined) {
      EXPECT_TRUE(late->ApplyChange(c).ok());
    }
  });
  ASSERT_TRUE(primary->Initialize(kFlat, 0, {1, -2, 3, -4, 5, -6, 7, -8}).ok());
  for (int w = 0; w < 3; ++w) ASSERT_TRUE(primary->Register(w, kFlat).ok());
  for (int64_t s = 0; s < 10; ++s) {
    for (int w = 0; w < 3; ++w) {
      std::vector<float> g(8);
      for (int i = 0; i < 8; ++i) g[i] = 0.3f * (i - 3) + 0.1f * w - 0.05f * s;
      // Worker 2 computes from version 0 throughout: stale, then dropped as too stale.
      const int64_t base = w == 2 ? 0 : primary->version();
      absl::StatusOr<PushOutcome> out =
          primary->Push({w, s, base, 0, 8, Incarnation(*primary, w)}, g);
      ASSERT_TRUE(out.ok()) << out.status();
    }
    if (s == 4) {  // a backup joins: the primary's state, then the changes after it
      ShardState state;
      ASSERT_TRUE(primary->Checkpoint(&state).ok());
      ASSERT_TRUE(late->Restore(state).ok());
      late_joined = true;
    }
  }
  EXPECT_GT(updates, 20);
  EXPECT_GT(taken, 0);  // the drops reached the backups too (their sequences are used up)
  ExpectSameState(*primary, *backup);
  ExpectSameState(*primary, *late);
  // Exactly-once carries over: a push the primary took is a duplicate at the backup.
  ASSERT_TRUE(backup->Register(0, kFlat).ok());
  absl::StatusOr<PushOutcome> again = backup->Push(
      {0, 9, backup->version(), 0, 8, Incarnation(*backup, 0)}, std::vector<float>(8, 1));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->duplicate);
}

TEST(ReplicatedShardTest, AChangeOutOfOrderOrThatDoesNotFitIsRefusedAndChangesNothing) {
  std::unique_ptr<ParameterShard> backup = *ParameterShard::Create(Config());
  std::vector<float> values(8, 1.0f);
  ShardChange update{.index = 1,
                     .kind = ShardChange::Kind::kUpdate,
                     .version = 1,
                     .worker_id = 0,
                     .learning_rate = 0.1f,
                     .values = values};
  EXPECT_EQ(backup->ApplyChange(update).code(), absl::StatusCode::kFailedPrecondition);
  ShardChange init{.index = 1, .kind = ShardChange::Kind::kInitialize, .values = values};
  ASSERT_TRUE(backup->ApplyChange(init).ok());
  EXPECT_EQ(backup->ApplyChange(init).code(), absl::StatusCode::kFailedPrecondition);  // again
  update.index = 3;                                                                    // a gap
  EXPECT_EQ(backup->ApplyChange(update).code(), absl::StatusCode::kFailedPrecondition);
  update.index = 2;
  update.version = 5;  // not the next version
  EXPECT_EQ(backup->ApplyChange(update).code(), absl::StatusCode::kFailedPrecondition);
  std::vector<float> short_values(3, 1.0f);
  update.version = 1;
  update.values = short_values;
  EXPECT_EQ(backup->ApplyChange(update).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(backup->version(), 0);
  update.values = values;
  ASSERT_TRUE(backup->ApplyChange(update).ok());
  EXPECT_EQ(backup->version(), 1);
}

ShardChange Change(int64_t index, const std::vector<float>& values) {
  return ShardChange{
      .index = index, .kind = ShardChange::Kind::kUpdate, .version = index, .values = values};
}

TEST(ReplicationLogTest, AChangeCountsAsReplicatedOnlyOnceTheBackupAcknowledgedIt) {
  ReplicationLog log;
  const std::vector<float> values = {1, 2, 3};
  auto none = [](int64_t) { return false; };  // no stage held: values kept
  log.Append(Change(1, values), none);
  // No backup: nothing can be acknowledged.
  EXPECT_EQ(log.WaitReplicated(absl::InfiniteFuture()).code(), absl::StatusCode::kUnavailable);
  const int64_t attachment = log.Attach();
  log.Append(Change(2, values), none);  // after Attach, before the snapshot (taken at change 2)
  log.Start(attachment, 2);
  EXPECT_FALSE(*log.Next(attachment, 2, absl::ZeroDuration()));  // in the snapshot
  log.Append(Change(3, values), none);
  absl::StatusOr<std::optional<std::shared_ptr<const ReplicationLog::Entry>>> next =
      log.Next(attachment, 2, absl::ZeroDuration());
  ASSERT_TRUE(next.ok() && next->has_value());
  EXPECT_EQ((**next)->change.index, 3);
  EXPECT_EQ(std::vector<float>((**next)->change.values.begin(), (**next)->change.values.end()),
            values);
  EXPECT_EQ(log.WaitReplicated(absl::Now() + absl::Milliseconds(20)).code(),
            absl::StatusCode::kUnavailable);
  log.Acknowledge(attachment, 2);  // the snapshot
  EXPECT_EQ(log.WaitReplicated(absl::Now() + absl::Milliseconds(20)).code(),
            absl::StatusCode::kUnavailable);
  log.Acknowledge(attachment, 3);
  EXPECT_TRUE(log.WaitReplicated(absl::Now()).ok());
  // A change naming a stage: its values are kept unless the attached backup holds that stage.
  ShardChange staged = Change(4, values);
  staged.forward_tag = 9;
  log.Append(staged, [&](int64_t a) { return a == attachment; });
  next = log.Next(attachment, 3, absl::ZeroDuration());
  ASSERT_TRUE(next.ok() && next->has_value());
  EXPECT_EQ((**next)->change.forward_tag, 9u);
  EXPECT_TRUE((**next)->change.values.empty());
  EXPECT_EQ((**next)->length, 3);
  staged.index = 5;
  log.Append(staged, none);
  next = log.Next(attachment, 4, absl::ZeroDuration());
  ASSERT_TRUE(next.ok() && next->has_value());
  EXPECT_EQ(std::vector<float>((**next)->change.values.begin(), (**next)->change.values.end()),
            values);
  EXPECT_EQ((**next)->length, 3);
  log.Acknowledge(attachment, 5);
  EXPECT_TRUE(log.WaitReplicated(absl::Now()).ok());
  // A waiter is released, unacknowledged, when the backup goes away.
  log.Append(Change(6, values), none);
  std::thread detach([&] {
    absl::SleepFor(absl::Milliseconds(50));
    log.Detach(attachment);
  });
  EXPECT_EQ(log.WaitReplicated(absl::InfiniteFuture()).code(), absl::StatusCode::kUnavailable);
  detach.join();
  EXPECT_EQ(log.Next(attachment, 3, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kCancelled);
  log.Close();
  EXPECT_EQ(log.Attach(), 0);
}

const char kMlp[] = "mlp:784-32-10";

TEST(ReplicationTest, PsctlStatusShowsEachReplicaWithItsRoleAndOneThatIsDown) {
  // Before: one row per shard, from whichever replica the client reached (often the backup, with
  // finished workers "active yes"), and the long "primary/backup" address broke the columns.
  LocalCluster cluster(ExecutableDir(), NewRunDir("replication"));
  ASSERT_TRUE(cluster.StartShards(1, kMlp, 1, {}, /*replicas=*/2).ok());
  const std::string primary = cluster.ProcessAddress(0), backup = cluster.ProcessAddress(1);
  ASSERT_TRUE(WaitForRole(primary, "primary", absl::Seconds(30)));
  ASSERT_TRUE(WaitForRole(backup, "backup", absl::Seconds(30)));
  auto psctl = [&] {
    const std::string log = NewRunDir("psctl") + "/out.log";
    absl::StatusOr<Subprocess> p =
        Subprocess::Start({ExecutableDir() + "/psctl", "status", "--ps=" + cluster.ShardAddress(0),
                           "--hidden=32", "--interval=0.1"},
                          log);
    EXPECT_TRUE(p.ok());
    absl::StatusOr<int> code = p.ok() ? p->Wait(absl::Seconds(60)) : p.status();
    return std::make_pair(code.ok() ? *code : -1, ReadFile(log));
  };
  auto [code, table] = psctl();
  EXPECT_EQ(code, 0) << table;
  EXPECT_NE(table.find(primary + " primary"), std::string::npos) << table;
  EXPECT_NE(table.find(backup + " backup"), std::string::npos) << table;
  // A replica down: its row says so, and the table still comes from its peer.
  cluster.shards()[1].Signal(SIGKILL);
  ASSERT_TRUE(cluster.shards()[1].Wait(absl::Seconds(10)).ok());
  auto [down_code, down_table] = psctl();
  EXPECT_EQ(down_code, 0) << down_table;
  EXPECT_NE(down_table.find(backup + " down"), std::string::npos) << down_table;
  EXPECT_NE(down_table.find("down: shard 0 (" + backup + "): "), std::string::npos) << down_table;
  EXPECT_EQ(down_table.find("): shard 0 ("), std::string::npos) << down_table;
}

// A backup takes over with its own settings, so it must run its primary's consistency model: the
// state it receives names the primary's (shard_state.proto), and a backup of another one refuses
// to follow, saying why, rather than joining and changing the job's rules at a failover.
TEST(ReplicationTest, ABackupOfAnotherConsistencyModelIsRefused) {
  const std::string dir = NewRunDir("replication");
  const int p0 = *FreePort(), p1 = *FreePort();
  auto start = [&](int replica, int port, int peer, const std::string& consistency) {
    return Subprocess::Start(
        {ExecutableDir() + "/ps", "--model=" + std::string(kMlp), "--num_workers=1",
         "--host=127.0.0.1", absl::StrCat("--port=", port), absl::StrCat("--peer=127.0.0.1:", peer),
         absl::StrCat("--replica=", replica), "--consistency=" + consistency},
        absl::StrCat(dir, "/ps-", replica, ".log"));
  };
  absl::StatusOr<Subprocess> primary = start(0, p0, p1, "async");
  ASSERT_TRUE(primary.ok()) << primary.status();
  absl::StatusOr<Subprocess> backup = start(1, p1, p0, "ssp:2");
  ASSERT_TRUE(backup.ok()) << backup.status();
  const std::string address = absl::StrCat("127.0.0.1:", p1);
  const std::string says = "the primary runs --consistency=async, this backup ssp:2";
  bool refused = false;
  for (absl::Time end = absl::Now() + absl::Seconds(60); absl::Now() < end && !refused;) {
    refused = ReadFile(dir + "/ps-1.log").find(says) != std::string::npos;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(refused) << ReadFile(dir + "/ps-1.log");
  EXPECT_EQ(Stats(address).replica_role(), "joining");
  EXPECT_EQ(Stats(absl::StrCat("127.0.0.1:", p0)).replica_role(), "primary");
}

// The acceptance test of replication: two replicated shards, two workers. The primary of shard 1
// is killed (SIGKILL) mid-run; its backup takes over, the workers carry on, and the killed one,
// started again, joins the new primary as its backup (state transfer mid-run). Then that primary
// is killed too. No acknowledged push is lost: every worker's 600 steps were acknowledged, and the
// survivor applied exactly 1,200 updates.
TEST(ReplicationTest, KilledPrimariesLoseNoAcknowledgedPush) {
  const std::string run_dir = NewRunDir("replication");
  LocalCluster cluster(ExecutableDir(), run_dir);
  ASSERT_TRUE(cluster.StartShards(2, kMlp, 2, {}, /*replicas=*/2).ok());
  // At most 200 steps/s per worker, so at most 400 updates/s per shard on any machine: the
  // restarted replica joins mid-run, and the 300 updates after the second kill take >= 0.75 s.
  const std::vector<std::string> flags = {"--hidden=32", "--steps=600", "--push_delay=fixed:0.005"};
  ASSERT_TRUE(cluster.StartWorker(0, 2, flags).ok());
  std::vector<std::string> prefetching = flags;
  prefetching.push_back("--prefetch");
  ASSERT_TRUE(cluster.StartWorker(1, 2, prefetching).ok());
  ASSERT_TRUE(cluster.StartEvaluator({"--hidden=32", "--interval_seconds=0.5"}).ok());
  // Processes: 0, 1 = shard 0's replicas; 2, 3 = shard 1's.
  ASSERT_TRUE(WaitForRole(cluster.ProcessAddress(2), "primary", absl::Seconds(30)));
  ASSERT_TRUE(WaitForVersion(cluster.ProcessAddress(2), 300, absl::Minutes(2)));
  cluster.shards()[2].Signal(SIGKILL);
  ASSERT_EQ(*cluster.shards()[2].Wait(absl::Seconds(10)), 128 + SIGKILL);
  ASSERT_TRUE(WaitForRole(cluster.ProcessAddress(3), "primary", absl::Seconds(30)));
  ASSERT_TRUE(cluster.RestartShard(2).ok());  // joins the new primary as its backup
  ASSERT_TRUE(WaitForRole(cluster.ProcessAddress(2), "backup", absl::Seconds(30)));
  const int64_t joined_at = Stats(cluster.ProcessAddress(2)).version();
  ASSERT_TRUE(WaitForVersion(cluster.ProcessAddress(3), 900, absl::Minutes(2)));
  cluster.shards()[3].Signal(SIGKILL);
  ASSERT_EQ(*cluster.shards()[3].Wait(absl::Seconds(10)), 128 + SIGKILL);
  std::cout << "shard 1's primary killed at version >= 300 and again at >= 900; the restarted "
               "replica joined at version "
            << joined_at << std::endl;

  double stall = 0;
  for (int rank : {0, 1}) {
    ASSERT_EQ(*cluster.worker(rank)->Wait(absl::Minutes(3)), 0) << "worker " << rank;
    const std::string csv = absl::StrCat(run_dir, "/worker-", rank, ".csv");
    EXPECT_EQ(Column(LastLine(csv), 0), 599);
    stall = std::max(stall, LongestGapSeconds(csv));
    std::string log = ReadFile(absl::StrCat(run_dir, "/worker-", rank, ".log"));
    EXPECT_NE(log.find("trying its other replica"), std::string::npos) << log;
  }
  std::cout << "longest stall of a worker step: " << stall << " s" << std::endl;
  ASSERT_TRUE(WaitForRole(cluster.ProcessAddress(2), "primary", absl::Seconds(30)));
  v1::StatsResponse survivor = Stats(cluster.ProcessAddress(2));
  EXPECT_EQ(survivor.replica_epoch(), 3);
  EXPECT_EQ(survivor.version(), 1200);
  int64_t applied = 0;
  for (const v1::WorkerStats& w : survivor.workers()) applied += w.pushes_applied();
  EXPECT_EQ(applied, 1200);
  EXPECT_EQ(Stats(cluster.ProcessAddress(0)).version(), 1200);  // shard 0, never failed over
  EXPECT_EQ(cluster.Stop(), "ps-1-1 exited with status 137");
  const double accuracy = Column(LastLine(run_dir + "/evaluator.csv"), 3);
  std::cout << "test accuracy " << accuracy << std::endl;
  EXPECT_GE(accuracy, 0.65);  // as RecoveryTest: well above chance, below the lowest measured
}

// A primary cut off (SIGSTOP) rather than dead: the worker's calls time out, its backup takes
// over, the run goes on; continued (SIGCONT), the old primary acknowledges no push, finds its peer
// at a higher epoch, and exits saying it was fenced.
TEST(ReplicationTest, AStoppedPrimaryIsReplacedAndAcknowledgesNothingAfterwards) {
  const std::string run_dir = NewRunDir("replication");
  LocalCluster cluster(ExecutableDir(), run_dir);
  ASSERT_TRUE(cluster.StartShards(1, kMlp, 1, {}, /*replicas=*/2).ok());
  // At most 100 steps/s: still running well after the takeover, however fast the machine. The
  // worker keeps its default 10 s RPC deadline: it notices the stopped primary by keepalive.
  ASSERT_TRUE(
      cluster.StartWorker(0, 1, {"--hidden=32", "--steps=600", "--push_delay=fixed:0.01"}).ok());
  const std::string old_primary = cluster.ProcessAddress(0);
  ASSERT_TRUE(WaitForVersion(old_primary, 100, absl::Minutes(2)));
  cluster.shards()[0].Signal(SIGSTOP);
  ASSERT_TRUE(WaitForRole(cluster.ProcessAddress(1), "primary", absl::Seconds(30)));
  const int64_t taken_over_at = Stats(cluster.ProcessAddress(1)).version();
  ASSERT_TRUE(WaitForVersion(cluster.ProcessAddress(1), taken_over_at + 20, absl::Minutes(1)));

  // A client of the old primary alone: whatever it tries, nothing is acknowledged.
  cluster.shards()[0].Signal(SIGCONT);
  ClientOptions once;
  once.rpc_timeout = absl::Seconds(2);
  once.retry_for = absl::ZeroDuration();
  ShardedClient client({old_primary}, ModelIdentity{kMlp, 784 * 32 + 32 + 32 * 10 + 10, 1}, 0,
                       once);
  absl::StatusOr<int64_t> next = client.Register();
  if (next.ok()) {
    std::vector<float> params(client.model().total_params), gradient(params.size(), 0.01f);
    client.Pull(absl::MakeSpan(params)).IgnoreError();
    absl::StatusOr<ShardedClient::PushSummary> pushed = client.Push(gradient);
    EXPECT_FALSE(pushed.ok());
  }
  absl::StatusOr<int> code = cluster.shards()[0].Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << "the old primary is still running";
  EXPECT_NE(*code, 0);
  EXPECT_NE(ReadFile(run_dir + "/ps-0-0.log").find("fenced"), std::string::npos);

  ASSERT_EQ(*cluster.worker(0)->Wait(absl::Minutes(3)), 0);
  EXPECT_EQ(Column(LastLine(run_dir + "/worker-0.csv"), 0), 599);
  const v1::StatsResponse survivor = Stats(cluster.ProcessAddress(1));
  EXPECT_EQ(survivor.version(), 600);  // every step acknowledged, none lost, none twice
  EXPECT_EQ(survivor.replica_epoch(), 2);
  const double stall = LongestGapSeconds(run_dir + "/worker-0.csv");
  std::cout << "took over at version " << taken_over_at << "; longest stall of a step: " << stall
            << " s" << std::endl;
  // The backup takes over after --failover_seconds (1) of silence; the worker's calls to the
  // stopped primary fail within 3 s (keepalive, transport/channel_options.h), not at their 10 s
  // deadline. Generous for a loaded machine.
  EXPECT_LT(stall, 1 + 3 + 3);
  cluster.Stop();
}

// The double failure an epoch file guards against: the primary is cut off, its backup takes over
// and acknowledges pushes, then dies. Restarted empty, the backup must not join the old primary,
// whose state misses those pushes: its join carries the epoch it knew and fences that primary.
TEST(ReplicationTest, AReplicaRestartedAfterATakeoverFencesTheStalePrimaryInsteadOfJoiningIt) {
  const std::string run_dir = NewRunDir("replication");
  LocalCluster cluster(ExecutableDir(), run_dir);
  ASSERT_TRUE(cluster.StartShards(1, kMlp, 1, {}, /*replicas=*/2).ok());
  ASSERT_TRUE(
      cluster.StartWorker(0, 1, {"--hidden=32", "--steps=100000", "--rpc_timeout_seconds=2"}).ok());
  const std::string stale = cluster.ProcessAddress(0), backup = cluster.ProcessAddress(1);
  ASSERT_TRUE(WaitForVersion(stale, 50, absl::Minutes(2)));
  cluster.shards()[0].Signal(SIGSTOP);
  ASSERT_TRUE(WaitForRole(backup, "primary", absl::Seconds(30)));
  const int64_t taken_over_at = Stats(backup).version();
  ASSERT_TRUE(WaitForVersion(backup, taken_over_at + 20, absl::Minutes(1)));  // acknowledged
  cluster.worker(0)->Signal(SIGKILL);
  cluster.shards()[1].Signal(SIGKILL);
  ASSERT_EQ(*cluster.shards()[1].Wait(absl::Seconds(10)), 128 + SIGKILL);
  EXPECT_EQ(ReadFile(run_dir + "/ps-0-1.epoch"), "2\n");
  cluster.shards()[0].Signal(SIGCONT);
  ASSERT_TRUE(cluster.RestartShard(1).ok());

  absl::StatusOr<int> code = cluster.shards()[0].Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << "the stale primary is still running";
  EXPECT_NE(*code, 0);
  EXPECT_NE(ReadFile(run_dir + "/ps-0-0.log").find("a backup knows epoch 2"), std::string::npos);
  const v1::StatsResponse restarted = Stats(backup);
  EXPECT_EQ(restarted.replica_role(), "joining");
  EXPECT_FALSE(restarted.initialized());  // nothing stale was copied into it
  cluster.Stop();
}

}  // namespace
}  // namespace ps
