// Multi-process tests of the consistency models: real ps processes on 127.0.0.1, workers either
// real processes or in-test clients computing real gradients on Fashion-MNIST.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/model_spec.h"
#include "deploy/local_cluster.h"
#include "kernels/backend.h"
#include "proto/ps.grpc.pb.h"
#include "tests/run_dir.h"
#include "trainer/idx_dataset.h"
#include "trainer/network.h"
#include "trainer/overlapped_step.h"
#include "client/sharded_client.h"

namespace ps {
namespace {

std::string NewRunDir() { return ps::NewRunDir("consistency"); }

std::vector<v1::StatsResponse> AllStats(LocalCluster& cluster, int shards) {
  std::vector<v1::StatsResponse> out;
  for (int s = 0; s < shards; ++s) out.push_back(Stats(cluster.ShardAddress(s)));
  return out;
}

// Trains `steps` synchronous steps with one client thread per batch slice and returns the
// final weights. Thread w at step s uses examples [(s*W + w)*B, (s*W + w + 1)*B). With `overlap`,
// each step's pull and push overlap its compute layer by layer (trainer/overlapped_step.h).
std::vector<float> TrainSync(int workers, int batch, int steps, const Examples& data,
                             bool overlap = false) {
  LocalCluster cluster(ExecutableDir(), NewRunDir());
  std::vector<int> sizes = {784, 32, 10};
  EXPECT_TRUE(cluster
                  .StartShards(2, MlpSpec(sizes), workers,
                               {"--consistency=sync", "--optimizer=sgd", "--lr=0.1"})
                  .ok());
  std::unique_ptr<Backend> probe_backend = MakeCpuBackend(1);
  Network probe(MlpNetwork(sizes), 1, probe_backend.get());
  ModelIdentity model{probe.Fingerprint(), probe.num_params(), 2};
  std::vector<std::string> addresses = {cluster.ShardAddress(0), cluster.ShardAddress(1)};
  {
    ShardedClient init(addresses, model, 0);
    EXPECT_TRUE(init.Register().ok());
    EXPECT_TRUE(init.Initialize(probe.InitialParams(5)).ok());
  }
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      std::unique_ptr<Backend> backend = MakeCpuBackend(1);
      Network mlp(MlpNetwork(sizes), batch, backend.get());
      mlp.SetTrainingSet(data.features.data(), data.labels.data(), data.count);
      ShardedClient client(addresses, model, w);
      ASSERT_TRUE(client.Register().ok());
      std::vector<float> params(mlp.num_params()), grad(mlp.num_params());
      std::vector<int32_t> indices(batch);
      for (int s = 0; s < steps; ++s) {
        int64_t first = (static_cast<int64_t>(s) * workers + w) * batch;
        std::iota(indices.begin(), indices.end(), static_cast<int32_t>(first));
        if (overlap) {
          OverlappedStep step(&client, client.StartPull(absl::MakeSpan(params)), grad);
          ASSERT_TRUE(mlp.GradientOfExamples(absl::MakeSpan(params), indices.data(), batch,
                                             absl::MakeSpan(grad), step.Hooks())
                          .ok());
          EXPECT_EQ(step.versions().version[0], s);
          ASSERT_TRUE(step.TakePush().Wait().ok());
          continue;
        }
        absl::StatusOr<ShardedClient::Versions> versions = client.Pull(absl::MakeSpan(params));
        ASSERT_TRUE(versions.ok());
        EXPECT_EQ(versions->version[0], s);  // the barrier: every worker computes from version s
        mlp.GradientOfExamples(params, indices.data(), batch, absl::MakeSpan(grad));
        ASSERT_TRUE(client.Push(grad).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ShardedClient reader(addresses, model, -1);
  std::vector<float> params(probe.num_params());
  absl::StatusOr<ShardedClient::Versions> versions = reader.Pull(absl::MakeSpan(params));
  EXPECT_TRUE(versions.ok());
  if (!versions.ok()) return {};
  EXPECT_EQ(versions->version, (std::vector<int64_t>{steps, steps}));
  for (const v1::StatsResponse& s : AllStats(cluster, 2)) {
    // Every applied gradient had staleness 0.
    EXPECT_EQ(std::vector<int64_t>(s.staleness_counts().begin(), s.staleness_counts().end()),
              std::vector<int64_t>{workers * steps});
  }
  return params;
}

// 4 workers of batch B against one of batch 4B; `overlap`: the 4 overlap each step's
// communication with its compute.
void ExpectSyncIdentity(bool overlap) {
  const int kBatch = 16, kSteps = 6;
  Range first{0, 4 * kBatch * kSteps};
  absl::StatusOr<Examples> data =
      LoadFashionMnist("/usr/share/datasets/fashion-mnist", "train", &first);
  ASSERT_TRUE(data.ok()) << data.status();
  std::vector<float> four = TrainSync(4, kBatch, kSteps, *data, overlap);
  std::vector<float> one = TrainSync(1, 4 * kBatch, kSteps, *data);
  double diff = 0, norm = 0, moved = 0;
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  std::vector<float> initial =
      Network(MlpNetwork({784, 32, 10}), 1, backend.get()).InitialParams(5);
  for (size_t i = 0; i < one.size(); ++i) {
    diff += (four[i] - one[i]) * (four[i] - one[i]);
    norm += one[i] * one[i];
    moved += (one[i] - initial[i]) * (one[i] - initial[i]);
  }
  EXPECT_GT(std::sqrt(moved / norm), 1e-3) << "training should have moved the weights";
  EXPECT_LE(std::sqrt(diff / norm), 1e-5);
  std::cout << "relative difference |w4 - w1| / |w1| = " << std::sqrt(diff / norm) << "\n";
}

TEST(SyncIdentityTest, FourWorkersOfBatchBEqualOneWorkerOfBatch4B) { ExpectSyncIdentity(false); }

TEST(SyncIdentityTest, SoDoFourWorkersOverlappingCommunicationWithCompute) {
  ExpectSyncIdentity(true);
}

const char kMlp32[] = "mlp:784-32-10";  // the model StartWorkers' workers train

// Starts `workers` real worker processes with `flags`; worker 0 gets `straggler_flags` too.
void StartWorkers(LocalCluster& cluster, int workers, std::vector<std::string> flags,
                  const std::vector<std::string>& straggler_flags = {}) {
  flags.push_back("--hidden=32");
  flags.push_back("--heartbeat_seconds=0.2");
  for (int r = 0; r < workers; ++r) {
    std::vector<std::string> f = flags;
    if (r == 0) f.insert(f.end(), straggler_flags.begin(), straggler_flags.end());
    ASSERT_TRUE(cluster.StartWorker(r, workers, f).ok());
  }
}

// Runs `workers` workers (worker 0 a 4x straggler) for 120 steps under ssp:`bound` and checks
// that no applied push was staler than `limit`, and that they overlapped at all.
void ExpectSspStalenessWithin(int workers, int bound, int limit, std::vector<std::string> flags) {
  LocalCluster cluster(ExecutableDir(), NewRunDir());
  ASSERT_TRUE(
      cluster.StartShards(2, kMlp32, workers, {absl::StrCat("--consistency=ssp:", bound)}).ok());
  flags.push_back("--steps=120");
  StartWorkers(cluster, workers, flags, {"--slowdown=4"});
  for (int r = 0; r < workers; ++r) ASSERT_EQ(*cluster.worker(r)->Wait(absl::Minutes(3)), 0);
  for (const v1::StatsResponse& s : AllStats(cluster, 2)) {
    EXPECT_EQ(s.pushes_applied(), workers * 120);
    EXPECT_LE(s.staleness_counts_size() - 1, limit) << "max staleness above the bound";
    int64_t stale = 0;
    for (int k = 1; k < s.staleness_counts_size(); ++k) stale += s.staleness_counts(k);
    EXPECT_GT(stale, 0) << "the workers should have overlapped at all";
  }
  EXPECT_EQ(cluster.Stop(), "");
}

TEST(SspBoundTest, NoAppliedPushIsStalerThanTheStatedBound) {
  const int kWorkers = 3, kBound = 1;
  ExpectSspStalenessWithin(kWorkers, kBound, (kWorkers - 1) * (2 * kBound + 1), {});
}

TEST(SspBoundTest, PrefetchingWorkersStayWithinTheBoundPlusTheirOwnPendingPush) {
  // Before, with ssp:0 and two prefetching workers (bound 1), staleness reached 4: the next
  // pull was admitted as if the worker's pending push did not exist.
  ExpectSspStalenessWithin(2, 0, 1, {"--prefetch"});
  const int kWorkers = 3, kBound = 1;
  ExpectSspStalenessWithin(kWorkers, kBound, (kWorkers - 1) * (2 * kBound + 1) + 1, {"--prefetch"});
}

TEST(SyncBarrierTest, APullHeldBackLongerThanTheRetryBudgetStillCompletes) {
  LocalCluster cluster(ExecutableDir(), NewRunDir());
  ASSERT_TRUE(cluster.StartShards(1, "flat:8", 2, {"--consistency=sync", "--optimizer=sgd"}).ok());
  ModelIdentity model{"flat:8", 8, 1};
  ClientOptions fast_give_up{absl::Seconds(1), absl::Seconds(1)};
  ShardedClient a({cluster.ShardAddress(0)}, model, 0, fast_give_up);
  ShardedClient b({cluster.ShardAddress(0)}, model, 1, fast_give_up);
  ASSERT_TRUE(a.Register().ok());
  ASSERT_TRUE(b.Register().ok());
  ASSERT_TRUE(a.Initialize(std::vector<float>(8, 1.0f)).ok());
  std::vector<float> params(8), grad(8, 0.5f);
  absl::StatusOr<ShardedClient::Versions> versions = a.Pull(absl::MakeSpan(params));
  ASSERT_TRUE(versions.ok());
  ASSERT_TRUE(a.Push(grad).ok());
  // A's next pull waits for B's gradient, three times longer than A's retry budget.
  std::thread late_b([&] {
    absl::SleepFor(absl::Seconds(3));
    ASSERT_TRUE(b.Push(grad).ok());
  });
  absl::Time start = absl::Now();
  versions = a.Pull(absl::MakeSpan(params));
  late_b.join();
  ASSERT_TRUE(versions.ok()) << versions.status();
  EXPECT_GE(absl::Now() - start, absl::Seconds(2.5));
  EXPECT_EQ(versions->version[0], 1);
}

// Two shards, two real workers training local models under `consistency` for `steps` steps each
// (worker 0 killed with SIGKILL at its step 100 and started again if `kill`), and an evaluator
// scoring the centre. Returns the final test accuracy; checks that each worker reached its last
// step and that the shards rejected nothing but a push the kill cut off.
double TrainLocalModels(const std::string& consistency, int steps, bool kill) {
  LocalCluster cluster(ExecutableDir(), NewRunDir());
  EXPECT_TRUE(cluster.StartShards(2, kMlp32, 2, {"--consistency=" + consistency}).ok());
  EXPECT_TRUE(cluster.StartEvaluator({"--hidden=32", "--interval_seconds=2"}).ok());
  // Each push (every 4 steps under easgd:4, 8 under local:8) waits 20 ms, so that the run goes
  // on well past the kill at step 100 on any machine: 700 steps after it take at least 1.7 s.
  std::vector<std::string> flags = {"--hidden=32",
                                    "--heartbeat_seconds=0.2",
                                    "--local_lr=0.05",
                                    "--local_momentum=0.9",
                                    "--batch_size=32",
                                    absl::StrCat("--steps=", steps),
                                    "--push_delay=fixed:0.02"};
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(cluster.StartWorker(r, 2, flags).ok());
  const std::string csv = cluster.run_dir() + "/worker-0.csv";
  if (kill) {
    EXPECT_TRUE(WaitForStep(csv, 100, absl::Minutes(2)));
    cluster.worker(0)->Signal(SIGKILL);
    EXPECT_EQ(*cluster.worker(0)->Wait(absl::Seconds(10)), 128 + SIGKILL);
    EXPECT_TRUE(cluster.StartWorker(0, 2, flags).ok());
  }
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<int> code = cluster.worker(r)->Wait(absl::Minutes(3));
    EXPECT_TRUE(code.ok() && *code == 0)
        << ReadFile(cluster.run_dir() + "/worker-" + std::to_string(r) + ".log");
    EXPECT_EQ(Column(LastLine(cluster.run_dir() + "/worker-" + std::to_string(r) + ".csv"), 0),
              steps - 1);
  }
  if (kill) {  // it went on from the centre, not from step 0
    const std::string log = ReadFile(cluster.run_dir() + "/worker-0.log");
    const size_t at = log.rfind("starting at step ");
    EXPECT_TRUE(at != std::string::npos && std::atoll(log.c_str() + at + 17) >= 90) << log;
  }
  for (const v1::StatsResponse& s : AllStats(cluster, 2)) {
    EXPECT_EQ(s.consistency(), consistency);
    // A push cut off by the SIGKILL counts as rejected; nothing else may be.
    EXPECT_LE(s.pushes_rejected(), kill ? 1 : 0);
    EXPECT_GT(s.version(), 0);
  }
  EXPECT_EQ(cluster.Stop(), "");
  const double accuracy = Column(LastLine(cluster.run_dir() + "/evaluator.csv"), 3);
  std::cout << consistency << ": test accuracy of the centre " << accuracy << std::endl;
  return accuracy;
}

// EASGD: the centre learns from the workers' elastic differences alone (the shards never see a
// gradient), and a worker killed mid-run starts over from the centre and finishes.
TEST(EasgdTest, TheCentreLearnsAndAKilledWorkerStartsAgainFromIt) {
  EXPECT_GE(TrainLocalModels("easgd:4,0.45", 800, /*kill=*/true), 0.75);
}

// Local SGD: every 8 steps a round averages the two workers' models; a worker killed mid-run
// starts its round again from the centre, and the other waits for it. Bar: 0.05 below the lowest
// of 7 runs on this 2-core machine (0.791-0.826 without the kill).
TEST(LocalSgdTest, RoundsAverageTheWorkersModelsAndAKilledWorkerRejoinsThem) {
  EXPECT_GE(TrainLocalModels("local:8", 800, /*kill=*/true), 0.74);
}

// Polls `condition` until it holds or `timeout` passes; returns its last value. The deadlines
// are generous: on a loaded 2-core CI machine a check may take seconds to become true.
bool Eventually(const std::function<bool()>& condition,
                absl::Duration timeout = absl::Seconds(30)) {
  absl::Time deadline = absl::Now() + timeout;
  while (!condition() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  return condition();
}

TEST(SyncMembershipTest, BackupWorkerKeepsRoundsClosingWhenAWorkerStops) {
  LocalCluster cluster(ExecutableDir(), NewRunDir());
  ASSERT_TRUE(cluster
                  .StartShards(2, kMlp32, 3,
                               {"--consistency=sync", "--backup_workers=1", "--lease_seconds=600"})
                  .ok());
  StartWorkers(cluster, 3, {});
  auto version = [&] { return AllStats(cluster, 2)[0].version(); };
  ASSERT_TRUE(Eventually([&] {  // all three taking part (data loading takes a moment)
    v1::StatsResponse s = AllStats(cluster, 2)[0];
    return s.registered_workers() == 3 && s.version() >= 30;
  }));
  cluster.worker(2)->Signal(SIGKILL);
  ASSERT_EQ(*cluster.worker(2)->Wait(absl::Seconds(10)), 128 + SIGKILL);
  int64_t at_kill = version();
  EXPECT_TRUE(Eventually([&] { return version() > at_kill + 30; }))
      << "rounds close with W-1 pushes, lease or not";
  EXPECT_EQ(AllStats(cluster, 2)[0].active_workers(), 3);  // the 10-minute lease has not run out
}

TEST(SyncMembershipTest, AWorkerThatFinishesLeavesAndTheOthersCarryOn) {
  LocalCluster cluster(ExecutableDir(), NewRunDir());
  // Without Leave the remaining worker would wait out a 10-minute lease.
  ASSERT_TRUE(
      cluster.StartShards(2, kMlp32, 2, {"--consistency=sync", "--lease_seconds=600"}).ok());
  ASSERT_TRUE(cluster.StartWorker(0, 2, {"--hidden=32", "--steps=150"}).ok());
  ASSERT_TRUE(cluster.StartWorker(1, 2, {"--hidden=32", "--steps=30"}).ok());
  for (int r : {1, 0}) {
    absl::StatusOr<int> code = cluster.worker(r)->Wait(absl::Minutes(2));
    ASSERT_TRUE(code.ok()) << "worker " << r << " is stuck at the barrier";
    EXPECT_EQ(*code, 0);
  }
  // 30 rounds of two gradients (the first waits for both to register), then 120 of worker 0
  // alone: version 150.
  for (const v1::StatsResponse& s : AllStats(cluster, 2)) {
    EXPECT_EQ(s.active_workers(), 0);
    EXPECT_EQ(s.version(), 150);
    EXPECT_EQ(s.pushes_applied(), 180);
    EXPECT_EQ(s.pushes_dropped_late(), 0);
  }
}

// Runs a sync job of `workers` worker processes (seed 3, `steps` steps each) on 2 shards and
// returns its final weights; checks that every round had all the workers.
std::vector<float> RunSyncJob(int workers, int steps) {
  LocalCluster cluster(ExecutableDir(), NewRunDir());
  EXPECT_TRUE(cluster.StartShards(2, kMlp32, workers, {"--consistency=sync"}).ok());
  StartWorkers(cluster, workers, {absl::StrCat("--steps=", steps), "--seed=3"});
  for (int r = 0; r < workers; ++r) EXPECT_EQ(*cluster.worker(r)->Wait(absl::Minutes(3)), 0);
  for (const v1::StatsResponse& s : AllStats(cluster, 2)) {
    EXPECT_EQ(s.version(), steps);
    EXPECT_EQ(s.pushes_applied(), workers * steps);
  }
  absl::StatusOr<ModelIdentity> model = ParseModelSpec(kMlp32, 2);
  EXPECT_TRUE(model.ok());
  if (!model.ok()) return {};
  ShardedClient reader({cluster.ShardAddress(0), cluster.ShardAddress(1)}, *model, -1);
  std::vector<float> params(model->total_params);
  EXPECT_TRUE(reader.Pull(absl::MakeSpan(params)).ok());
  EXPECT_EQ(cluster.Stop(), "");
  return params;
}

// Rounds sum in rank order and start once every worker registered: two runs of the same job end
// at the same bits, however the workers' pushes interleaved. (Summed in arrival order, 3 workers'
// pushes gave different bits from run to run.)
TEST(SyncDeterminismTest, TwoRunsOfTheSameJobEndAtTheSameBits) {
  const int kWorkers = 3, kSteps = 40;
  std::vector<float> first = RunSyncJob(kWorkers, kSteps);
  std::vector<float> second = RunSyncJob(kWorkers, kSteps);
  ASSERT_EQ(first.size(), second.size());
  ASSERT_FALSE(first.empty());
  size_t differ = 0;
  for (size_t i = 0; i < first.size(); ++i) {
    differ += std::memcmp(&first[i], &second[i], sizeof(float)) != 0;
  }
  EXPECT_EQ(differ, 0u) << "of " << first.size() << " weights";
}

// A worker that registers late finds the first round still open: the first worker's gradient
// waits in it (version 0) until the second registers and pushes, the shard says once what it
// waits for, and every round of the job has both workers.
TEST(SyncStartTest, AWorkerThatStartsFirstRunsNoRoundAlone) {
  LocalCluster cluster(ExecutableDir(), NewRunDir());
  ASSERT_TRUE(cluster.StartShards(2, kMlp32, 2, {"--consistency=sync"}).ok());
  const std::vector<std::string> flags = {"--hidden=32", "--heartbeat_seconds=0.2", "--steps=20"};
  ASSERT_TRUE(cluster.StartWorker(0, 2, flags).ok());
  ASSERT_TRUE(Eventually([&] {  // worker 0's first gradient is in the round on both shards
    for (const v1::StatsResponse& s : AllStats(cluster, 2)) {
      if (s.workers_size() != 1 || s.workers(0).pushes_applied() != 1) return false;
    }
    return true;
  }));
  for (const v1::StatsResponse& s : AllStats(cluster, 2)) EXPECT_EQ(s.version(), 0);
  ASSERT_TRUE(cluster.StartWorker(1, 2, flags).ok());
  for (int r = 0; r < 2; ++r) EXPECT_EQ(*cluster.worker(r)->Wait(absl::Minutes(2)), 0);
  for (const v1::StatsResponse& s : AllStats(cluster, 2)) {
    EXPECT_EQ(s.version(), 20);
    EXPECT_EQ(s.pushes_applied(), 40);
    EXPECT_EQ(s.pushes_dropped_late(), 0);
  }
  EXPECT_EQ(cluster.Stop(), "");
  const std::string log = ReadFile(cluster.run_dir() + "/ps-0.log");
  const std::string waits = "sync: round for version 0 waits for 2 workers to register, 1 has";
  const size_t at = log.find(waits);
  EXPECT_NE(at, std::string::npos) << log;
  EXPECT_EQ(log.find(waits, at + 1), std::string::npos) << "logged once";
}

TEST(SyncMembershipTest, LeaseRemovesADeadWorkerAndItRejoinsWhenRestarted) {
  LocalCluster cluster(ExecutableDir(), NewRunDir());
  // A 3 s lease against 0.2 s heartbeats: a live worker is never starved that long.
  ASSERT_TRUE(cluster.StartShards(2, kMlp32, 3, {"--consistency=sync", "--lease_seconds=3"}).ok());
  StartWorkers(cluster, 3, {});
  auto stats = [&] { return AllStats(cluster, 2)[0]; };
  ASSERT_TRUE(Eventually([&] {  // all three taking part (data loading takes a moment)
    v1::StatsResponse s = stats();
    return s.registered_workers() == 3 && s.version() >= 30;
  }));
  cluster.worker(2)->Signal(SIGKILL);
  ASSERT_EQ(*cluster.worker(2)->Wait(absl::Seconds(10)), 128 + SIGKILL);
  // Once its lease runs out the shard stops waiting for it, and rounds close again.
  ASSERT_TRUE(Eventually([&] { return stats().active_workers() == 2; }));
  int64_t without = stats().version();
  EXPECT_TRUE(Eventually([&] { return stats().version() > without + 20; }));
  // Restarted, it registers, is active again and takes part in the rounds.
  ASSERT_TRUE(cluster.StartWorker(2, 3, {"--hidden=32", "--heartbeat_seconds=0.2"}).ok());
  ASSERT_TRUE(Eventually([&] { return stats().active_workers() == 3; }));
  int64_t rejoined = stats().version();
  EXPECT_TRUE(Eventually([&] {
    v1::StatsResponse s = stats();
    for (const v1::WorkerStats& w : s.workers()) {
      if (w.worker_id() == 2 && w.pushes_applied() > 0 && s.version() > rejoined + 20) return true;
    }
    return false;
  })) << "the restarted worker's gradients are part of the rounds";
  v1::StatsResponse last = stats();
  for (const v1::WorkerStats& w : last.workers()) EXPECT_TRUE(w.active()) << w.worker_id();
  EXPECT_EQ(cluster.Stop(), "");
}

}  // namespace
}  // namespace ps
