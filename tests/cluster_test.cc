// Multi-process tests: real ps, worker and evaluator processes talking gRPC on 127.0.0.1 with
// ports chosen at run time.
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "transport/chunking.h"
#include "transport/grpc_status.h"
#include "deploy/local_cluster.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "proto/ps.grpc.pb.h"
#include "tests/run_dir.h"
#include "client/sharded_client.h"

namespace ps {
namespace {

std::string NewRunDir() { return ps::NewRunDir("cluster"); }

const std::vector<std::string> kWorkerFlags = {"--hidden=128,64", "--batch_size=64"};
const char kMlp[] = "mlp:784-128-64-10";  // the model kWorkerFlags train

// Test accuracy after 1,400 async updates depends on how the workers interleave. Measured on a
// 2-core machine with the other core busy (2026-11-22, 12 runs each): 0.818-0.852 without
// prefetching, 0.797-0.831 with it. The bar sits 0.05 below the lowest: it checks that the
// cluster trains, not how well one interleaving did.
constexpr double kTrainedAccuracy = 0.75;
constexpr double kCnnTrainedAccuracy = 0.7;  // see ACnnTrainsOnTwoShards

// Waits for workers 0..count-1 to finish; each must exit 0 (its log printed otherwise).
void WaitForWorkers(LocalCluster& cluster, int count) {
  for (int r = 0; r < count; ++r) {
    absl::StatusOr<int> code = cluster.worker(r)->Wait(absl::Minutes(4));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0) << ReadFile(cluster.run_dir() + "/worker-" + std::to_string(r) + ".log");
  }
}

// Two shards, two workers of 700 steps each and an evaluator, with `client_flags` added to the
// workers' and the evaluator's: every step applied once, and the model trains.
void TrainTwoShardsTwoWorkers(const std::vector<std::string>& client_flags) {
  LocalCluster cluster(ExecutableDir(), NewRunDir());
  ASSERT_TRUE(cluster.StartShards(2, kMlp, 2, {"--optimizer=momentum", "--lr=0.01"}).ok());
  std::vector<std::string> evaluator = {"--hidden=128,64", "--interval_seconds=1"};
  std::vector<std::string> flags = kWorkerFlags;
  flags.push_back("--steps=700");
  bool shared_memory = true;
  for (const std::string& f : client_flags) {
    flags.push_back(f);
    if (f.rfind("--pull_dtype", 0) == 0 || f.rfind("--shared_memory", 0) == 0) {
      evaluator.push_back(f);
    }
    if (f == "--shared_memory=false") shared_memory = false;
  }
  ASSERT_TRUE(cluster.StartEvaluator(evaluator).ok());
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(cluster.StartWorker(r, 2, flags).ok());
  WaitForWorkers(cluster, 2);
  for (int s = 0; s < 2; ++s) {
    v1::StatsResponse stats = Stats(cluster.ShardAddress(s));
    EXPECT_EQ(stats.version(), 1400);
    EXPECT_EQ(stats.pushes_applied(), 1400);
    EXPECT_EQ(stats.pushes_rejected(), 0);
    EXPECT_EQ(stats.registered_workers(), 2);
    // Co-located, tensors go through shared memory unless the clients turned it off.
    if (shared_memory) {
      EXPECT_GT(stats.shm_pushes(), 0);
      EXPECT_GT(stats.shm_pulls(), 0);
    } else {
      EXPECT_EQ(stats.shm_pushes() + stats.shm_pulls() + stats.shm_segments(), 0);
    }
  }
  EXPECT_EQ(cluster.Stop(), "");  // every daemon exits 0 on SIGTERM
  std::string last = LastLine(cluster.run_dir() + "/evaluator.csv");
  EXPECT_EQ(Column(last, 1), 1400) << "the evaluator scores the final weights at shutdown";
  std::cout << "test accuracy after 1400 updates: " << Column(last, 3) << "\n";
  EXPECT_GE(Column(last, 3), kTrainedAccuracy) << last;
  EXPECT_NE(ReadFile(cluster.run_dir() + "/staleness-shard-0.csv").find("staleness,count\n0,"),
            std::string::npos);
}

TEST(ClusterTest, TwoShardsTwoWorkersTrain) { TrainTwoShardsTwoWorkers({}); }

// A small CNN (the shards given a non-canonical spelling of the workers' model): two workers of
// 150 steps, every step applied once, and it learns. Bar: 0.1 below the lowest of 3 runs on a
// loaded 2-core machine (0.800-0.824 after 300 updates); it checks that a CNN trains end to end.
TEST(ClusterTest, ACnnTrainsOnTwoShards) {
  LocalCluster cluster(ExecutableDir(), NewRunDir());
  ASSERT_TRUE(cluster
                  .StartShards(2, "cnn:1x28x28-conv8k5s1p2-pool2-fc32-10", 2,
                               {"--optimizer=momentum", "--lr=0.01"})
                  .ok());
  const std::string model = "--model=cnn:1x28x28-conv8k5-pool2-fc32-10";
  ASSERT_TRUE(cluster.StartEvaluator({model, "--interval_seconds=2"}).ok());
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(cluster.StartWorker(r, 2, {model, "--batch_size=64", "--steps=150"}).ok());
  }
  WaitForWorkers(cluster, 2);
  for (int s = 0; s < 2; ++s) {
    v1::StatsResponse stats = Stats(cluster.ShardAddress(s));
    EXPECT_EQ(stats.version(), 300);
    EXPECT_EQ(stats.pushes_rejected(), 0);
    EXPECT_EQ(stats.model_fingerprint(), "cnn:1x28x28-conv8k5-pool2-fc32-10");
  }
  EXPECT_EQ(cluster.Stop(), "");
  std::string last = LastLine(cluster.run_dir() + "/evaluator.csv");
  EXPECT_EQ(Column(last, 1), 300) << "the evaluator scores the final weights at shutdown";
  std::cout << "CNN test accuracy after 300 updates: " << Column(last, 3) << "\n";
  EXPECT_GE(Column(last, 3), kCnnTrainedAccuracy) << last;
}

// Gradients as bfloat16 and weights as float16 over gRPC (half the bytes each way) train to the
// same bar; the shards keep and apply float32. (TwoShardsTwoWorkersTrain moves tensors through
// shared memory, as co-located clients do; this one keeps them on the socket, as remote ones do.)
TEST(ClusterTest, TwoShardsTwoWorkersTrainOnA16BitWireOverGrpc) {
  TrainTwoShardsTwoWorkers({"--push_dtype=bf16", "--pull_dtype=fp16", "--shared_memory=false"});
}

// Workers that overlap each step's pull and push with its compute, layer by layer, and prefetch
// the next step's weights, over the shards' data plane (as remote workers do): every step applied
// once, and the model trains.
TEST(ClusterTest, WorkersOverlappingCommunicationWithComputeTrain) {
  TrainTwoShardsTwoWorkers({"--overlap", "--prefetch", "--shared_memory=false"});
}

// Weights beyond float16's range are pulled as its largest, not as infinities, and the shard
// says so once.
TEST(ClusterTest, Float16PullsSaturateLargeWeightsAndTheShardSaysSo) {
  LocalCluster cluster(ExecutableDir(), NewRunDir());
  ASSERT_TRUE(cluster.StartShards(1, "flat:4", 1, {}).ok());
  ClientOptions options;
  options.pull_type = WireType::kFloat16;
  ShardedClient client({cluster.ShardAddress(0)}, {"flat:4", 4, 1}, 0, options);
  ASSERT_TRUE(client.Register().ok());
  ASSERT_TRUE(client.Initialize({1e6f, -1e6f, 1.5f, 0.0f}).ok());
  std::vector<float> pulled(4);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(client.Pull(absl::MakeSpan(pulled)).ok());
  EXPECT_EQ(pulled, (std::vector<float>{65504.0f, -65504.0f, 1.5f, 0.0f}));
  EXPECT_EQ(cluster.Stop(), "");
  const std::string log = ReadFile(cluster.run_dir() + "/ps-0.log");
  const std::string line = "beyond fp16's range was sent as its largest (logged once)";
  const size_t first = log.find(line);
  ASSERT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find(line, first + line.size()), std::string::npos) << log;
}

TEST(ClusterTest, PrefetchingWorkersTrainOnAsyncAndSyncShardsButNotLocalOnes) {
  LocalCluster cluster(ExecutableDir(), NewRunDir());
  ASSERT_TRUE(cluster.StartShards(2, kMlp, 2, {"--optimizer=momentum", "--lr=0.01"}).ok());
  ASSERT_TRUE(cluster.StartEvaluator({"--hidden=128,64", "--interval_seconds=1"}).ok());
  std::vector<std::string> flags = kWorkerFlags;
  flags.push_back("--steps=700");
  flags.push_back("--prefetch");
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(cluster.StartWorker(r, 2, flags).ok());
  for (int r = 0; r < 2; ++r) EXPECT_EQ(*cluster.worker(r)->Wait(absl::Minutes(4)), 0);
  for (int s = 0; s < 2; ++s) EXPECT_EQ(Stats(cluster.ShardAddress(s)).pushes_applied(), 1400);
  EXPECT_EQ(cluster.Stop(), "");
  std::string last = LastLine(cluster.run_dir() + "/evaluator.csv");
  EXPECT_EQ(Column(last, 1), 1400) << last;
  std::cout << "test accuracy after 1400 prefetching updates: " << Column(last, 3) << "\n";
  EXPECT_GE(Column(last, 3), kTrainedAccuracy) << last;

  // Sync: each prefetched pull waits at the shards for its round, so no push is stale or dropped.
  // (Rounds close with the workers registered: one that starts first may run rounds alone.)
  LocalCluster sync(ExecutableDir(), NewRunDir());
  ASSERT_TRUE(sync.StartShards(2, "mlp:784-8-10", 2, {"--consistency=sync"}).ok());
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(sync.StartWorker(r, 2, {"--hidden=8", "--prefetch", "--steps=150"}).ok());
  }
  for (int r = 0; r < 2; ++r) EXPECT_EQ(*sync.worker(r)->Wait(absl::Minutes(2)), 0);
  for (int s = 0; s < 2; ++s) {
    v1::StatsResponse stats = Stats(sync.ShardAddress(s));
    EXPECT_EQ(stats.pushes_applied(), 300);
    EXPECT_EQ(stats.staleness_counts_size(), 1) << "a push staler than 0 under sync";
    EXPECT_EQ(stats.pushes_dropped_late(), 0);
    EXPECT_GE(stats.version(), 150);
    EXPECT_LE(stats.version(), 300);
  }
  EXPECT_EQ(sync.Stop(), "");

  LocalCluster local(ExecutableDir(), NewRunDir());
  ASSERT_TRUE(local.StartShards(1, "mlp:784-8-10", 1, {"--consistency=local:4"}).ok());
  ASSERT_TRUE(local.StartWorker(0, 1, {"--hidden=8", "--prefetch"}).ok());
  EXPECT_EQ(*local.worker(0)->Wait(absl::Seconds(30)), 1);
  EXPECT_NE(ReadFile(local.run_dir() + "/worker-0.log").find("--prefetch needs async, ssp:S or "
                                                             "sync shards"),
            std::string::npos);
}

TEST(ClusterTest, WorkerKilledWithSigkillRejoinsAndTheRunCompletes) {
  LocalCluster cluster(ExecutableDir(), NewRunDir());
  ASSERT_TRUE(cluster.StartShards(2, kMlp, 2, {}).ok());
  // At most 250 steps/s, however fast the machine: the 350 steps after the kill at step 150 last
  // at least 1.4 s, so the worker is still training when it is killed.
  std::vector<std::string> flags = kWorkerFlags;
  flags.push_back("--steps=500");
  flags.push_back("--push_delay=fixed:0.004");
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(cluster.StartWorker(r, 2, flags).ok());
  const std::string csv = cluster.run_dir() + "/worker-0.csv";
  ASSERT_TRUE(WaitForStep(csv, 150, absl::Minutes(2)));
  // Kill rank 0, the one that initialised the model, mid-run and start it again.
  cluster.worker(0)->Signal(SIGKILL);
  ASSERT_EQ(*cluster.worker(0)->Wait(absl::Seconds(10)), 128 + SIGKILL);
  int64_t killed_at = static_cast<int64_t>(Column(LastLine(csv), 0));
  ASSERT_TRUE(cluster.StartWorker(0, 2, flags).ok());
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<int> code = cluster.worker(r)->Wait(absl::Minutes(3));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0);
  }
  std::string log = ReadFile(cluster.run_dir() + "/worker-0.log");
  EXPECT_NE(log.find("initialised 0 of 2 shards"), std::string::npos) << log;
  size_t at = log.rfind("starting at step ");
  ASSERT_NE(at, std::string::npos);
  int64_t resumed = std::atoll(log.c_str() + at + strlen("starting at step "));
  EXPECT_GE(resumed, killed_at);
  EXPECT_LE(resumed, killed_at + 2);
  EXPECT_EQ(Column(LastLine(csv), 0), 499);
  for (int s = 0; s < 2; ++s) {
    // Every step applied exactly once on every shard: a step that reached only one shard before
    // the kill is delivered to the other when the worker resumes (the first answers duplicate).
    EXPECT_EQ(Stats(cluster.ShardAddress(s)).pushes_applied(), 1000) << "shard " << s;
  }
  EXPECT_EQ(cluster.Stop(), "");
}

TEST(ClusterTest, ASecondProcessWithTheSameRankSupersedesTheFirst) {
  LocalCluster cluster(ExecutableDir(), NewRunDir());
  ASSERT_TRUE(cluster.StartShards(2, kMlp, 1, {}).ok());
  // The first process is slowed to at most 10 steps/s, so that it is still short of the second's
  // --steps when the second has started (up to 38 s later) and takes over.
  std::vector<std::string> flags = kWorkerFlags;
  flags.push_back("--push_delay=fixed:0.1");
  flags.push_back("--steps=100000");
  ASSERT_TRUE(cluster.StartWorker(0, 1, flags).ok());
  ASSERT_TRUE(WaitForStep(cluster.run_dir() + "/worker-0.csv", 20, absl::Minutes(2)));
  Subprocess first = std::move(*cluster.worker(0));
  // The second process of rank 0 (its own log) registers and takes over the rank.
  flags = kWorkerFlags;
  flags.push_back("--steps=400");
  ASSERT_TRUE(cluster.StartWorker(0, 1, flags).ok());
  absl::StatusOr<int> first_code = first.Wait(absl::Minutes(2));
  ASSERT_TRUE(first_code.ok()) << "the superseded process went on";
  EXPECT_EQ(*first_code, 1);
  std::string log = ReadFile(cluster.run_dir() + "/worker-0.log");
  EXPECT_NE(log.find("was superseded by a newer process with the same rank"), std::string::npos)
      << log;
  absl::StatusOr<int> second_code = cluster.worker(0)->Wait(absl::Minutes(3));
  ASSERT_TRUE(second_code.ok());
  EXPECT_EQ(*second_code, 0);
  // Every step of the rank applied once on each shard, whichever process computed it.
  for (int s = 0; s < 2; ++s) EXPECT_EQ(Stats(cluster.ShardAddress(s)).pushes_applied(), 400);
  EXPECT_EQ(cluster.Stop(), "");
}

TEST(ClusterTest, AWorkerWithAnotherWorkerCountIsRefusedNamingBoth) {
  // Before: ps --num_workers=2 and worker --num_workers=3 trained, each worker's share of the data
  // silently wrong.
  LocalCluster cluster(ExecutableDir(), NewRunDir());
  ASSERT_TRUE(cluster.StartShards(2, kMlp, 2, {}).ok());
  ASSERT_TRUE(cluster.StartWorker(0, 3, kWorkerFlags).ok());
  absl::StatusOr<int> code = cluster.worker(0)->Wait(absl::Minutes(1));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 1);
  const std::string log = ReadFile(cluster.run_dir() + "/worker-0.log");
  EXPECT_NE(log.find("worker count mismatch: shard 0 serves a job of 2 workers (ps "
                     "--num_workers=2), this worker was started with --num_workers=3"),
            std::string::npos)
      << log;
  EXPECT_EQ(Stats(cluster.ShardAddress(0)).registered_workers(), 0);
}

// A shard pair holding a 1000-parameter "model" initialised to 0.5 * i, for malformed requests.
class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.StartShards(2, model_.fingerprint, 2, {"--optimizer=sgd"}).ok());
    client_ = std::make_unique<ShardedClient>(
        std::vector<std::string>{cluster_.ShardAddress(0), cluster_.ShardAddress(1)}, model_, 0);
    ASSERT_TRUE(client_->Register().ok());
    for (int i = 0; i < 1000; ++i) initial_[i] = 0.5f * i;
    ASSERT_EQ(*client_->Initialize(initial_), 2);
    stub_ = v1::ParameterServer::NewStub(
        grpc::CreateChannel(cluster_.ShardAddress(1), grpc::InsecureChannelCredentials()));
  }

  // Pushes raw chunks to shard 1 (range [500, 1000)); the first carries `header` if set.
  grpc::Status Push(const v1::PushHeader* header, const std::vector<std::string>& payloads,
                    v1::PushResponse* response = nullptr) {
    v1::PushResponse ignored;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto writer = stub_->Push(&context, response ? response : &ignored);
    for (size_t i = 0; i < payloads.size(); ++i) {
      v1::PushChunk chunk;
      if (i == 0 && header != nullptr) *chunk.mutable_header() = *header;
      chunk.set_data(payloads[i]);
      if (!writer->Write(chunk)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }

  // A push header of worker 0, as registered by client_.
  v1::PushHeader Header(int64_t offset, int64_t length) const {
    v1::PushHeader h;
    h.set_worker_id(0);
    h.set_incarnation(client_->incarnation(1));
    h.set_sequence(0);
    h.set_base_version(0);
    h.set_offset(offset);
    h.set_length(length);
    h.set_dtype(v1::FLOAT32);
    return h;
  }

  static std::string Floats(std::vector<float> v) { return std::string(AsBytes(v)); }

  void ExpectWeightsUntouched() {
    std::vector<float> now(1000);
    absl::StatusOr<ShardedClient::Versions> versions = client_->Pull(absl::MakeSpan(now));
    ASSERT_TRUE(versions.ok());
    EXPECT_EQ(std::memcmp(now.data(), initial_.data(), sizeof(float) * 1000), 0);
    EXPECT_EQ(versions->version, (std::vector<int64_t>{0, 0}));
  }

  // One request of raw bytes to shard 0 through the generic stub.
  grpc::Status RawUnaryCall(const std::string& method, const std::string& bytes) {
    return ps::RawUnaryCall(cluster_.ShardAddress(0), method, bytes);
  }

  LocalCluster cluster_{ExecutableDir(), NewRunDir()};
  ModelIdentity model_{"flat:1000", 1000, 2};
  std::unique_ptr<ShardedClient> client_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
  std::vector<float> initial_ = std::vector<float>(1000);
};

// The same shard pair, for the client's own behaviour.
class ClientTest : public BadInputTest {};

// The client numbers its pushes (from Register on; a refused push uses its sequence up) and
// bases each on the versions its last waited-for pull saw; a prefetch is ahead of the push made
// next, or of the one already started since that pull. A sync shard shows which: it holds a
// pull ahead of a push it has not seen until that push closed its round.
TEST(ClientBookkeepingTest, SequencesBasesAndPrefetchesFollowTheCallsMade) {
  LocalCluster cluster(ExecutableDir(), NewRunDir());
  ASSERT_TRUE(cluster.StartShards(1, "flat:4", 1, {"--consistency=sync", "--lr=1"}).ok());
  ShardedClient client({cluster.ShardAddress(0)}, {"flat:4", 4, 1}, 0);
  ASSERT_EQ(*client.Register(), 0);
  ASSERT_TRUE(client.Initialize(std::vector<float>(4, 0.0f)).ok());
  EXPECT_EQ(client.last_pull().version, std::vector<int64_t>{0});  // none yet
  std::vector<float> w(4), ahead(4);
  ASSERT_TRUE(client.Pull(absl::MakeSpan(w)).ok());
  // Before this step's push: ahead of sequence 0, which the shard has not seen: held until that
  // push is in and its round closed (one worker: at once).
  ShardedClient::Pending<ShardedClient::Versions> prefetch =
      client.StartPull(absl::MakeSpan(ahead), /*prefetch=*/true);
  EXPECT_FALSE(prefetch.Done(absl::Milliseconds(300)));
  absl::StatusOr<ShardedClient::PushSummary> first = client.Push(std::vector<float>(4, 1.0f));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->sequence, 0);
  absl::StatusOr<ShardedClient::Versions> next = prefetch.Wait();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->version, std::vector<int64_t>{1});
  EXPECT_EQ(client.last_pull().version, std::vector<int64_t>{1});
  EXPECT_EQ(ahead, std::vector<float>(4, -1.0f));
  // After a push: ahead of that push, which is in.
  ASSERT_TRUE(client.Push(std::vector<float>(4, 0.0f)).ok());
  next = client.StartPull(absl::MakeSpan(ahead), /*prefetch=*/true).Wait();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->version, std::vector<int64_t>{2});
  // A push the shard refuses (not finite) uses sequence 2 up; the next carries 3, based on
  // version 2: staleness 0.
  EXPECT_EQ(client.Push(std::vector<float>(4, std::nanf(""))).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<ShardedClient::PushSummary> third = client.Push(std::vector<float>(4, 1.0f));
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->sequence, 3);
  EXPECT_EQ(third->max_staleness, 0);
  EXPECT_EQ(third->duplicates, 0);
  // A caller numbering pushes by its own steps; the client goes on from there.
  absl::StatusOr<ShardedClient::PushSummary> at_step = client.Push(std::vector<float>(4, 0.0f), 9);
  ASSERT_TRUE(at_step.ok()) << at_step.status();
  EXPECT_EQ(client.Push(std::vector<float>(4, 0.0f))->sequence, 10);
  // A new process of this worker resumes after the last.
  ShardedClient again({cluster.ShardAddress(0)}, {"flat:4", 4, 1}, 0);
  EXPECT_EQ(*again.Register(), 11);
  EXPECT_EQ(cluster.Stop(), "");
}

// The client's calls to every shard are Pending values: a pull and a push overlap, and their
// shards' calls run on threads the client keeps, so many calls start no thread.
TEST_F(ClientTest, PendingCallsOverlapOnThreadsTheClientKeeps) {
  // The process's threads, by id, listed while calls are in flight: a thread per call would add
  // new ids every round; kept threads add none (gRPC may start a few of its own under load).
  std::set<std::string> seen, after_first;
  auto note_threads = [&seen] {
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
      seen.insert(entry.path().filename().string());
    }
  };
  std::vector<float> a(1000), b(1000), grad(1000, 1.0f);
  absl::StatusOr<ShardedClient::Versions> base = client_->Pull(absl::MakeSpan(a));
  ASSERT_TRUE(base.ok());
  constexpr int kRounds = 40;
  for (int step = 0; step < kRounds; ++step) {
    ShardedClient::Pending<ShardedClient::PushSummary> push = client_->StartPush(grad);
    ShardedClient::Pending<ShardedClient::Versions> pull = client_->StartPull(absl::MakeSpan(b));
    note_threads();
    absl::StatusOr<ShardedClient::PushSummary> pushed = push.Wait();
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    EXPECT_EQ(pushed->duplicates, 0);
    base = pull.Wait();
    ASSERT_TRUE(base.ok()) << base.status();
    EXPECT_EQ(pull.Wait().status().code(), absl::StatusCode::kFailedPrecondition);  // waited
    if (step == 0) after_first = seen;
  }
  EXPECT_LE(seen.size(), after_first.size() + 8)
      << "calls started threads: " << seen.size() - after_first.size() << " new over " << kRounds
      << " rounds";
  {
    // Not waited for: destroying it waits, so the values are there afterwards.
    ShardedClient::Pending<ShardedClient::Versions> dropped = client_->StartPull(absl::MakeSpan(a));
  }
  // w = 0.5 i - 0.01 (the default rate) * 40 pushes of 1.
  EXPECT_NEAR(a[999], 0.5 * 999 - 0.4, 1e-3);
  EXPECT_EQ(Stats(cluster_.ShardAddress(0)).version(), kRounds);
}

// A push whose parts are held sends each shard its part when told (a backward pass filling in
// the gradient), under one sequence; one dropped or cancelled before its parts were sent sends
// none of those left.
TEST_F(ClientTest, HeldPushesSendEachShardItsPartWhenToldUnderOneSequence) {
  auto version_of = [&](int shard) { return Stats(cluster_.ShardAddress(shard)).version(); };
  std::vector<float> grad(1000, 1.0f), w(1000);
  ASSERT_TRUE(client_->Pull(absl::MakeSpan(w)).ok());
  EXPECT_EQ(client_->shard_range(1), (Range{500, 1000}));
  ShardedClient::Pending<ShardedClient::PushSummary> push =
      client_->StartPush(grad, ShardedClient::kNextSequence, ShardedClient::Parts::kHeld);
  EXPECT_FALSE(push.Done(absl::Milliseconds(200)));
  EXPECT_EQ(version_of(0), 0);
  push.Send(1);
  push.Send(1);  // sent already: nothing
  EXPECT_FALSE(push.Done(absl::ZeroDuration()));
  absl::Time until = absl::Now() + absl::Seconds(30);
  while (version_of(1) == 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(version_of(1), 1);
  EXPECT_EQ(version_of(0), 0);
  absl::StatusOr<ShardedClient::PushSummary> pushed = push.Wait();  // sends shard 0's part
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->sequence, 0);
  EXPECT_EQ(pushed->duplicates, 0);
  EXPECT_EQ(version_of(0), 1);
  {
    // Dropped after shard 1's part: shard 0 never sees sequence 1.
    ShardedClient::Pending<ShardedClient::PushSummary> dropped =
        client_->StartPush(grad, ShardedClient::kNextSequence, ShardedClient::Parts::kHeld);
    dropped.Send(1);
  }
  EXPECT_EQ(version_of(0), 1);
  EXPECT_EQ(version_of(1), 2);
  ShardedClient::Pending<ShardedClient::PushSummary> cancelled =
      client_->StartPush(grad, ShardedClient::kNextSequence, ShardedClient::Parts::kHeld);
  client_->CancelPending();
  EXPECT_EQ(cancelled.Wait().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(version_of(0), 1);
  // The next push carries sequence 3 to both shards, each applying it once.
  absl::StatusOr<ShardedClient::PushSummary> next = client_->Push(grad);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->sequence, 3);
  EXPECT_EQ(next->duplicates, 0);
  EXPECT_EQ(version_of(0), 2);
  EXPECT_EQ(version_of(1), 3);
  // w = 0.5 i - 0.01 * the pushes each shard applied.
  ASSERT_TRUE(client_->Pull(absl::MakeSpan(w)).ok());
  EXPECT_NEAR(w[0], -0.02, 1e-6);
  EXPECT_NEAR(w[999], 0.5 * 999 - 0.03, 1e-3);
}

TEST_F(BadInputTest, MalformedPushesGetInvalidArgumentAndChangeNothing) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> grad(500, 1.0f), with_nan = grad, with_inf = grad;
  with_nan[3] = nan;
  with_inf[9] = -std::numeric_limits<float>::infinity();
  v1::PushHeader no_dtype = Header(500, 500);
  no_dtype.set_dtype(v1::DTYPE_UNSPECIFIED);
  v1::PushHeader bf16 = Header(500, 500);
  bf16.set_dtype(v1::BFLOAT16);
  v1::PushHeader ahead = Header(500, 500);
  ahead.set_base_version(99);
  v1::PushHeader unregistered = Header(500, 500);
  unregistered.set_worker_id(1);
  v1::PushHeader stranger = Header(500, 500);
  stranger.set_worker_id(666);
  v1::PushHeader far_sequence = Header(500, 500);
  far_sequence.set_sequence(-(int64_t{1} << 62));
  struct Case {
    std::string what;
    v1::PushHeader header;
    bool send_header;
    std::vector<std::string> payloads;
    grpc::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases = {
      {"short payload",
       Header(500, 500),
       true,
       {Floats(std::vector<float>(499, 1))},
       grpc::StatusCode::INVALID_ARGUMENT,
       "truncated data: got 499 values, declared 500"},
      {"long payload",
       Header(500, 500),
       true,
       {Floats(std::vector<float>(501, 1))},
       grpc::StatusCode::INVALID_ARGUMENT,
       "overruns the declared length"},
      {"offset outside",
       Header(400, 10),
       true,
       {Floats(std::vector<float>(10, 1))},
       grpc::StatusCode::INVALID_ARGUMENT,
       "push covers [400, 410); a push must cover shard 1's whole range [500, 1000)"},
      {"past the end",
       Header(995, 10),
       true,
       {Floats(std::vector<float>(10, 1))},
       grpc::StatusCode::INVALID_ARGUMENT,
       "whole range"},
      {"part of the shard",
       Header(500, 1),
       true,
       {Floats(std::vector<float>(1, 1))},
       grpc::StatusCode::INVALID_ARGUMENT,
       "whole range"},
      {"NaN",
       Header(500, 500),
       true,
       {Floats(with_nan)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "gradient value at offset 503 is nan"},
      {"Inf",
       Header(500, 500),
       true,
       {Floats(with_inf)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "offset 509 is -inf"},
      {"no dtype",
       no_dtype,
       true,
       {Floats(with_inf)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "unsupported dtype"},
      {"float32 bytes declared bfloat16",
       bf16,
       true,
       {Floats(grad)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "overruns the declared length: 1000 values for 500"},
      {"no header",
       Header(500, 500),
       false,
       {Floats(grad)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "no header"},
      {"partial float",
       Header(500, 500),
       true,
       {std::string(6, 'x')},
       grpc::StatusCode::INVALID_ARGUMENT,
       "not a whole number of fp32 values"},
      {"base version ahead",
       ahead,
       true,
       {Floats(grad)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "base_version 99"},
      {"negative sequence",
       far_sequence,
       true,
       {Floats(grad)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "is negative"},
      {"unregistered worker",
       unregistered,
       true,
       {Floats(grad)},
       grpc::StatusCode::FAILED_PRECONDITION,
       "worker 1 has not registered"},
      {"worker outside the job",
       stranger,
       true,
       {Floats(grad)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "worker id 666 is outside this job's [0, 2)"},
      {"header twice",
       Header(500, 500),
       true,
       {Floats(std::vector<float>(10, 1)), Floats(std::vector<float>(10, 1))},
       grpc::StatusCode::INVALID_ARGUMENT,
       "header appeared after the first chunk"},
  };
  // The "header twice" case needs the second chunk to carry a header too.
  for (const Case& c : cases) {
    grpc::Status s;
    if (c.what == "header twice") {
      grpc::ClientContext context;
      v1::PushResponse response;
      auto writer = stub_->Push(&context, &response);
      v1::PushChunk chunk;
      *chunk.mutable_header() = c.header;
      chunk.set_data(c.payloads[0]);
      writer->Write(chunk);
      writer->Write(chunk);
      writer->WritesDone();
      s = writer->Finish();
    } else {
      s = Push(c.send_header ? &c.header : nullptr, c.payloads);
    }
    EXPECT_EQ(s.error_code(), c.code) << c.what << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(c.message), std::string::npos)
        << c.what << ": " << s.error_message();
    ExpectWeightsUntouched();
  }
  EXPECT_EQ(Stats(cluster_.ShardAddress(1)).pushes_rejected(), static_cast<int64_t>(cases.size()));
  // The shard still works: a valid push applies.
  v1::PushResponse response;
  ASSERT_TRUE(Push(&cases[0].header, {Floats(grad)}, &response).ok());
  EXPECT_EQ(response.version(), 1);
}

TEST_F(BadInputTest, FiniteGradientsThatWouldOverflowAreRefusedAndChangeNothing) {
  // Before: two pushes of 3e38 under momentum turned every weight into -inf. With SGD at rate
  // 0.01 and weights up to 500, 3e38 pushes overflow after a few hundred; here the client pushes
  // until one is refused.
  std::vector<float> huge(1000, 3e38f), before(1000), after(1000);
  grpc::StatusCode refused = grpc::StatusCode::OK;
  int64_t sequence = 0;
  for (; sequence < 200 && refused == grpc::StatusCode::OK; ++sequence) {
    ASSERT_TRUE(client_->Pull(absl::MakeSpan(before)).ok());
    absl::StatusOr<ShardedClient::PushSummary> r = client_->Push(huge);
    if (!r.ok()) refused = ToGrpcStatus(r.status()).error_code();
  }
  ASSERT_EQ(refused, grpc::StatusCode::INVALID_ARGUMENT) << "3e38 never overflowed";
  ASSERT_TRUE(client_->Pull(absl::MakeSpan(after)).ok());
  // Each shard refuses on its own; one that refused kept its weights, and none is non-finite.
  for (float w : after) ASSERT_TRUE(std::isfinite(w));
  int refusing = 0;
  for (int s = 0; s < 2; ++s) {
    if (Stats(cluster_.ShardAddress(s)).updates_nonfinite() == 0) continue;
    ++refusing;
    EXPECT_EQ(std::memcmp(before.data() + 500 * s, after.data() + 500 * s, 500 * sizeof(float)), 0)
        << "shard " << s;
  }
  EXPECT_GE(refusing, 1);
  std::cout << "refused after " << sequence << " pushes of 3e38\n";
}

// The guard against absurd gradients (ps --max_norm_ratio, 5 by default): after 20 ordinary
// pushes, one of 3e38 in every element (finite, so no non-finite check stops it; it would have
// left the weights at ~3e36 for good) is dropped by both shards and counted, changing no weight
// and no version; the worker carries on with its next step.
TEST_F(BadInputTest, AnAbsurdGradientAmongOrdinaryOnesIsDroppedAndChangesNothing) {
  std::vector<float> weights(1000), before(1000), after(1000);
  for (int64_t sequence = 0; sequence < 20; ++sequence) {
    std::vector<float> gradient(1000, 0.01f * static_cast<float>(1 + sequence % 3));
    ASSERT_TRUE(client_->Pull(absl::MakeSpan(weights)).ok());
    ASSERT_TRUE(client_->Push(gradient).ok());
  }
  ASSERT_TRUE(client_->Pull(absl::MakeSpan(before)).ok());
  absl::StatusOr<ShardedClient::PushSummary> absurd =
      client_->Push(std::vector<float>(1000, 3e38f));
  ASSERT_TRUE(absurd.ok()) << absurd.status();
  EXPECT_EQ(absurd->dropped, 2);
  absl::StatusOr<ShardedClient::Versions> unchanged = client_->Pull(absl::MakeSpan(after));
  ASSERT_TRUE(unchanged.ok());
  EXPECT_EQ(std::memcmp(before.data(), after.data(), sizeof(float) * 1000), 0);
  EXPECT_EQ(unchanged->version, (std::vector<int64_t>{20, 20}));
  for (int s = 0; s < 2; ++s) {
    const v1::StatsResponse stats = Stats(cluster_.ShardAddress(s));
    EXPECT_EQ(stats.pushes_dropped_norm(), 1);
    EXPECT_EQ(stats.pushes_rejected(), 0);
  }
  ASSERT_TRUE(client_->Push(std::vector<float>(1000, 0.02f)).ok());
  ASSERT_TRUE(client_->Pull(absl::MakeSpan(after)).ok());
  EXPECT_NE(std::memcmp(before.data(), after.data(), sizeof(float) * 1000), 0);
}

TEST_F(BadInputTest, AStrangerCannotRegisterOrBlockTheJobWithMadeUpIds) {
  for (int id : {2, 666, 100000}) {
    ShardedClient stranger({cluster_.ShardAddress(0), cluster_.ShardAddress(1)}, model_, id);
    absl::StatusOr<int64_t> r = stranger.Register();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("outside this job's [0, 2)"), std::string::npos);
    EXPECT_EQ(stranger.Heartbeat(absl::Seconds(5)).code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(Stats(cluster_.ShardAddress(0)).registered_workers(), 1);
  ExpectWeightsUntouched();
}

TEST_F(BadInputTest, OversizedMessageIsRefusedAndTheShardSurvives) {
  std::string five_mib(5 << 20, '\0');
  grpc::Status s = Push(nullptr, {five_mib});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  ExpectWeightsUntouched();
  EXPECT_TRUE(cluster_.shards()[1].running());
}

TEST_F(BadInputTest, BadPullsRegistrationsAndReinitialisationChangeNothing) {
  grpc::ClientContext context;
  v1::PullRequest request;
  request.set_offset(100);
  request.set_length(10);
  request.mutable_model()->set_fingerprint(model_.fingerprint);
  request.mutable_model()->set_total_params(model_.total_params);
  request.mutable_model()->set_num_shards(model_.num_shards);
  auto reader = stub_->Pull(&context, request);
  v1::PullChunk chunk;
  while (reader->Read(&chunk)) {
  }
  grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("[100, 110) is not inside"), std::string::npos);

  ShardedClient wrong_model({cluster_.ShardAddress(0), cluster_.ShardAddress(1)},
                            {"flat:999", 999, 2}, 1);
  absl::StatusOr<int64_t> r = wrong_model.Register();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("model mismatch"), std::string::npos) << r.status();

  ShardedClient swapped({cluster_.ShardAddress(1), cluster_.ShardAddress(0)}, model_, 1);
  EXPECT_NE(swapped.Register().status().message().find("listed as shard 0"), std::string::npos);

  // A restarted initialiser offering other values changes nothing.
  EXPECT_EQ(*client_->Initialize(std::vector<float>(1000, 7.0f)), 0);
  ExpectWeightsUntouched();
}

TEST_F(BadInputTest, AClientOfAnotherProtocolVersionGetsUnimplemented) {
  // The package name versions the wire contract: a ps.v2 client reaches no method here.
  grpc::Status status = RawUnaryCall("/ps.v2.ParameterServer/GetStats", "");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << status.error_message();
  ExpectWeightsUntouched();
}

TEST_F(BadInputTest, AnUnparseableRequestGetsInvalidArgumentNamingTheMethod) {
  // 0xff: field 31, wire type 7, which does not exist.
  for (const char* method : {"Register", "Pull", "Heartbeat", "Leave", "GetStats"}) {
    grpc::Status status =
        RawUnaryCall(absl::StrCat("/ps.v1.ParameterServer/", method), std::string(8, '\xff'));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_EQ(status.error_message(), absl::StrCat("cannot parse ", method, " request"));
  }
  ExpectWeightsUntouched();
}

TEST(DaemonTest, HealthSaysServingOnlyOnceTheShardIsInitialised) {
  LocalCluster cluster(ExecutableDir(), NewRunDir());
  ASSERT_TRUE(cluster.StartShards(1, "flat:4", 1, {}).ok());
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(cluster.ShardAddress(0), grpc::InsecureChannelCredentials()));
  auto status = [&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::health::v1::HealthCheckResponse response;
    EXPECT_TRUE(health->Check(&context, grpc::health::v1::HealthCheckRequest(), &response).ok());
    return response.status();
  };
  EXPECT_EQ(status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  ShardedClient client({cluster.ShardAddress(0)}, {"flat:4", 4, 1}, 0);
  ASSERT_TRUE(client.Register().ok());
  ASSERT_TRUE(client.Initialize({1, 2, 3, 4}).ok());
  // At once: the shard answers pulls from the moment Initialize returns, and so says health.
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(status(), grpc::health::v1::HealthCheckResponse::SERVING) << "check " << i;
  }
}

// Runs a daemon to completion; returns its exit code and output.
std::pair<int, std::string> RunDaemon(std::vector<std::string> argv) {
  std::string log = NewRunDir() + "/out.log";
  argv[0] = ExecutableDir() + "/" + argv[0];
  absl::StatusOr<Subprocess> p = Subprocess::Start(argv, log);
  EXPECT_TRUE(p.ok());
  absl::StatusOr<int> code = p->Wait(absl::Seconds(90));
  EXPECT_TRUE(code.ok());
  return {code.ok() ? *code : -1, ReadFile(log)};
}

TEST(DaemonTest, BadFlagsExitNonZeroWithAOneLineReason) {
  struct Case {
    std::vector<std::string> argv;
    std::string reason;
  };
  std::vector<Case> cases = {
      {{"ps", "--shard_index=5", "--num_shards=2", "--model=flat:4", "--num_workers=1"},
       "ps: --shard_index=5 must be in [0, --num_shards=2)"},
      {{"ps", "--optimizer=rmsprop", "--model=flat:4", "--num_workers=1"},
       "unknown optimizer 'rmsprop'"},
      {{"ps", "--lr=-1", "--model=flat:4", "--num_workers=1"},
       "learning rate must be a positive number"},
      {{"ps", "--num_workers=1"}, "ps: --model is required"},
      {{"ps", "--model=flat:4"}, "ps: --num_workers is required"},
      {{"ps", "--model=rnn:3", "--num_workers=1"}, "bad model spec 'rnn:3': unknown kind 'rnn'"},
      {{"ps", "--model=cnn:3", "--num_workers=1"},
       "bad model spec 'cnn:3': input '3' is not CxHxW"},
      {{"ps", R"(--model={"tensors": [{"name": "w", "shape": [0]}]})", "--num_workers=1"},
       "ps: bad model layout: tensor 0: w has dimension 0"},
      {{"ps", "--model=/nonexistent/model.json", "--num_workers=1"},
       "ps: cannot open model layout file /nonexistent/model.json"},
      {{"worker", "--ps=127.0.0.1:1", R"(--model={"tensors": [{"name": "w", "shape": [4]}]})"},
       "the C++ worker and evaluator build mlp: and cnn: networks only"},
      {{"worker", "--ps=127.0.0.1:1", "--model=cnn:1x28x28-conv8k5-fc10-pool2-10"},
       "is not poolN before the dense layers"},
      {{"worker", "--ps=127.0.0.1:1", "--model=cnn:1x64x64-10"},
       "does not fit Fashion-MNIST: it needs a 1x28x28 input and 10 classes"},
      {{"ps", "--model=mlp:784-0-10", "--num_workers=1"}, "size '0' is not a number"},
      {{"ps", "--model=flat:2", "--num_shards=3", "--shard_index=0", "--num_workers=1"},
       "fewer parameters (2) than shards"},
      {{"ps", "--model=flat:4", "--num_workers=1", "--clip_norm=-1"}, "--clip_norm must be"},
      {{"ps", "--model=flat:4", "--num_workers=1", "--apply_threads=65"},
       "--apply_threads must be"},
      {{"ps", "--model=flat:4", "--num_workers=1", "--data_plane_lanes=9"},
       "--data_plane_lanes must be"},
      {{"ps", "--no_such_flag=1"}, "no_such_flag"},
      {{"ps", "--model=flat:4", "--num_workers=1", "--consistency=sync", "--peer=127.0.0.1:1"},
       "rounds (sync) are not replicated"},
      {{"ps", "--model=flat:4", "--num_workers=1", "--consistency=easgd:0"},
       "unknown consistency model 'easgd:0': T must be an integer in [1, 1000]"},
      {{"ps", "--model=flat:4", "--num_workers=1", "--consistency=local:8", "--dc_lambda=0.1"},
       "under --consistency=local:8 workers push changes of their models"},
      {{"worker", "--ps=127.0.0.1:1", "--local_lr=0"}, "--local_lr must be > 0"},
      {{"worker", "--ps=127.0.0.1:1", "--local_lr_schedule=cosine"},
       "--local_lr_schedule=cosine needs --steps"},
      {{"ps", "--model=flat:4", "--num_workers=1", "--peer=127.0.0.1:1", "--replica=2"},
       "--replica must be 0 or 1"},
      {{"ps", "--model=flat:4", "--num_workers=1", "--peer=127.0.0.1:1", "--forward_at_once=17"},
       "--forward_at_once must be 1 to 16"},
      {{"worker", "--ps=127.0.0.1:1/127.0.0.1:2/127.0.0.1:3"}, "at most two replicas"},
      {{"worker", "--ps=127.0.0.1:1", "--push_dtype=int8"}, "--push_dtype: unknown wire type"},
      {{"evaluator", "--ps=127.0.0.1:1", "--pull_dtype=fp8"}, "--pull_dtype: unknown wire type"},
      {{"launch", "--replicas=2", "--checkpoint_dir=/tmp/x"}, "--replicas=2 replaces checkpoints"},
      {{"worker", "--ps=localhost"}, "worker: bad shard address 'localhost'"},
      {{"worker", "--ps=127.0.0.1:1", "--rank=4", "--num_workers=4"}, "--rank=4 must be in"},
      {{"worker", "--ps=127.0.0.1:1", "--hidden=12,abc"}, "bad hidden layer size 'abc'"},
      {{"worker", "--ps=127.0.0.1:1", "--data_dir=/nonexistent"},
       "cannot open /nonexistent/train-images-idx3-ubyte.gz"},
      {{"worker", "--ps=127.0.0.1:1", "--device=tpu"}, "unknown --device 'tpu'"},
      {{"evaluator", "--ps="}, "evaluator: no shard addresses given"},
      {{"launch", "--workers=0"}, "launch: --shards and --workers must be positive"},
      {{"launch", "--steps=0", "--lr_schedule=cosine"},
       "launch: --lr_schedule=cosine needs --steps"},
      {{"launch", "--lr_schedule=linear"}, "launch: unknown --lr_schedule 'linear'"},
      {{"ps", "--model=flat:4", "--num_workers=1", "--metrics_port=70000"},
       "--metrics_port must be at most 65535"},
      {{"worker", "--ps=127.0.0.1:1", "--metrics_port=0", "--metrics_host=0.0.0.0"},
       "--metrics_host"},
      {{"ps", "--model=flat:4", "--num_workers=1", "--metrics_port=0", "--metrics_host=0.0.0.0",
        "--insecure"},
       "--metrics_host"},  // the service's --insecure does not open the metrics
      {{"worker", "--cluster=/nonexistent.json", "--role=worker:0"},
       "cannot read the cluster spec /nonexistent.json"},
      {{"ps", "--cluster=/nonexistent.json"}, "--cluster needs this daemon's role"},
  };
  for (const Case& c : cases) {
    auto [code, output] = RunDaemon(c.argv);
    EXPECT_NE(code, 0) << c.argv[1];
    EXPECT_NE(output.find(c.reason), std::string::npos) << c.argv[1] << " printed: " << output;
  }
}

// A CSV with at least one row after its header, or a non-empty image.
bool FileHasData(const std::string& path) {
  std::string text = ReadFile(path);
  if (path.size() > 4 && path.substr(path.size() - 4) == ".png") return text.size() > 1000;
  return std::count(text.begin(), text.end(), '\n') >= 2;
}

TEST(CommandTest, LaunchRunsAClusterAndLeavesCsvsAndAPlot) {
  std::string dir = NewRunDir() + "/runs/deep/run";  // parents made as needed
  auto [code, output] = RunDaemon({"launch", "--workers=2", "--steps=300", "--max_seconds=60",
                                   "--hidden=32", "--progress_seconds=1", "--run_dir=" + dir});
  EXPECT_EQ(code, 0) << output;
  // A run of known length: cosine over its 2 x 300 updates per shard.
  EXPECT_NE(ReadFile(dir + "/config.txt").find("--lr_schedule=cosine --lr_total_updates=600"),
            std::string::npos)
      << ReadFile(dir + "/config.txt");
  EXPECT_NE(output.find("final test accuracy 0."), std::string::npos) << output;
  // This project's MLP, without --target_accuracy: measured against the published baseline.
  EXPECT_NE(output.find("; published MLP baseline (0.8833) "), std::string::npos) << output;
  EXPECT_NE(ReadFile(dir + "/plot.gp").find("title 'published MLP baseline (0.8833)'"),
            std::string::npos);
  EXPECT_NE(output.find("updates/shard ("), std::string::npos) << output;
  EXPECT_NE(output.find("/s), test accuracy"), std::string::npos) << output;
  for (const char* f : {"/training.png", "/evaluator.csv", "/worker-0.csv", "/worker-1.csv",
                        "/config.txt", "/stats-shard-1.json", "/staleness-shard-0.csv"}) {
    EXPECT_TRUE(FileHasData(dir + f)) << f;
  }
}

TEST(CommandTest, BadFlagsAreRefusedBeforeAnythingStarts) {
  // Before: "launch: ps-0 exited at start; see runs/.../ps-0.log", the reason only in that log,
  // and an empty run directory left behind. Each daemon's own parser now checks its flags first
  // (--dry_run), flags passed through included.
  const std::string dir = NewRunDir() + "/never";
  struct Case {
    std::vector<std::string> argv;
    std::string reason;
  };
  for (const Case& c : std::vector<Case>{
           {{"launch", "--consistency=bogus"}, "launch: ps: unknown consistency model 'bogus'"},
           {{"launch", "--optimizer=adamw"}, "launch: ps: unknown optimizer 'adamw'"},
           {{"launch", "--ps_flags=--learning_rate=3"}, "Unknown command line flag 'learning_rate'"},
           {{"launch", "--worker_flags=--push_dtype=fp8"}, "launch: worker: --push_dtype"},
           {{"experiment", "--optimizer=adamw", "--epochs=0.01"},
            "experiment: async_w4: ps: unknown optimizer 'adamw'"},
           {{"launch", "--data_dir=/nonexistent"},
            "launch: worker: cannot open /nonexistent/train-images-idx3-ubyte.gz"},
       }) {
    std::vector<std::string> argv = c.argv;
    argv.push_back(argv[0] == "launch" ? "--run_dir=" + dir : "--report_dir=" + dir);
    const absl::Time start = absl::Now();
    auto [code, output] = RunDaemon(argv);
    EXPECT_EQ(code, 1) << output;
    EXPECT_NE(output.find(c.reason), std::string::npos) << output;
    EXPECT_FALSE(std::filesystem::exists(dir)) << c.argv[1];
    EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << c.argv[1];
  }
}

TEST(DaemonTest, AMisspeltKeyInASpecIsNamedAsTheSpecs) {
  // Before: psctl spec accepted it, and ps died with "Unknown command line flag" not saying that
  // it came from the spec.
  const std::string path = NewRunDir() + "/cluster.json";
  std::ofstream(path) << R"({"shards": ["127.0.0.1:5001"], "workers": 2,
                             "ps": {"learning_rate": 0.1}})";
  const std::string reason = "cluster spec " + path +
                             ": the \"ps\" section sets \"learning_rate\", which is not a ps flag";
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{"ps", "--cluster=" + path, "--role=ps:0"},
        std::vector<std::string>{"psctl", "spec", "--cluster=" + path}}) {
    auto [code, output] = RunDaemon(argv);
    EXPECT_EQ(code, 1) << argv[0];
    EXPECT_NE(output.find(reason), std::string::npos) << output;
  }
}

TEST(CommandTest, HelpExitsZeroListingOnlyTheProgramsOwnFlags) {
  struct Case {
    std::string program, has, has_not;
  };
  for (const Case& c : std::vector<Case>{{"ps", "--worker_identity=false", "--batch_size"},
                                         {"worker", "--batch_size=64", "--worker_identity"},
                                         {"evaluator", "--interval_seconds", "--batch_size"},
                                         {"psctl", "--retry_seconds=-1", "--health_port"},
                                         {"export_model", "--out", "--health_port"},
                                         {"launch", "--worker_identity=false", "--cluster"},
                                         {"experiment", "--report_dir", "--metrics_port"}}) {
    auto [code, output] = RunDaemon({c.program, "--help"});
    EXPECT_EQ(code, 0) << c.program;
    EXPECT_NE(output.find("\n  " + c.has), std::string::npos) << c.program << ": " << output;
    EXPECT_EQ(output.find("\n  " + c.has_not), std::string::npos) << c.program << ": " << output;
    EXPECT_EQ(output.find("Flags from"), std::string::npos) << c.program;
  }
}

// The launcher keeps a run going through deaths it injects itself: a worker restarted rejoins,
// a shard restarted resumes from its checkpoints (on by default, in the run directory). The
// deaths are triggered by progress, at 20% (worker 1, after 1,000 of the 5,000 steps) and 50%
// (shard 0, after 5,000 of the 10,000 updates summed over both shards) of the run, on any machine.
TEST(CommandTest, LaunchRecoversFromAWorkerAndAShardKilledMidRun) {
  std::string dir = NewRunDir() + "/run";
  auto [code, output] =
      RunDaemon({"launch", "--workers=2", "--steps=2500", "--kill=worker:1@1000steps,ps:0@5000u",
                 "--ps_flags=--checkpoint_updates=500", "--run_dir=" + dir});
  EXPECT_EQ(code, 0) << output;
  for (const char* line :
       {"killed worker 1 (--kill after 1000 steps)",
        "worker 1 exited with status 137: starting it again (it rejoins and resumes)",
        "killed shard 0 (--kill after 5000 updates)",
        "shard 0 exited with status 137: starting it again from its checkpoints", "recovered 2 "}) {
    EXPECT_NE(output.find(line), std::string::npos) << line << " missing from: " << output;
  }
  // Every step of both workers was done, the killed one's too (it resumed where it stopped).
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(Column(LastLine(dir + "/worker-" + std::to_string(r) + ".csv"), 0), 2499) << r;
  }
  // Measured on a 2-core machine (2026-11-24, 3 runs idle and 3 with a core kept busy):
  // 0.8715-0.8740 (a cosine schedule over the run's 5,000 steps). The bar is 0.05 below.
  const double accuracy = Column(LastLine(dir + "/evaluator.csv"), 3);
  std::cout << "final test accuracy " << accuracy << std::endl;
  EXPECT_GE(accuracy, 0.82) << output;
  // Shard 0 resumed from a checkpoint (one every 500 updates: the kill came after ~2,500), not
  // from nothing, and knew how many updates it lost.
  const std::string log = ReadFile(dir + "/ps-0.log");
  int64_t resumed = -1, reached = -1, lost = -1;
  const size_t at = log.find("resumed from the checkpoint at version ");
  ASSERT_NE(at, std::string::npos) << log;
  ASSERT_EQ(std::sscanf(log.c_str() + at,
                        "resumed from the checkpoint at version %" SCNd64 " in %*s the previous "
                        "process had reached version %" SCNd64 ": %" SCNd64 " update(s) lost",
                        &resumed, &reached, &lost),
            3)
      << log.substr(at, 200);
  EXPECT_GE(resumed, 500);
  EXPECT_EQ(lost, reached - resumed);
  EXPECT_GE(lost, 0);
  auto [bad, why] = RunDaemon({"launch", "--kill=ps:0@1s", "--checkpoint_dir=none"});
  EXPECT_NE(bad, 0);
  EXPECT_NE(why.find("--kill=ps:... needs checkpoints"), std::string::npos) << why;
  auto [bad_plan, reason] = RunDaemon({"launch", "--kill=worker:9@1s"});
  EXPECT_NE(bad_plan, 0);
  EXPECT_NE(reason.find("bad --kill item 'worker:9@1s': no worker 9"), std::string::npos) << reason;
  // A death the run ends before reaching is not silently skipped.
  auto [missed, said] = RunDaemon({"launch", "--workers=1", "--steps=20", "--hidden=8",
                                   "--kill=worker:0@1000steps", "--run_dir=" + dir + "-short"});
  EXPECT_NE(missed, 0);
  EXPECT_NE(said.find("--kill: worker 0 after 1000 steps never happened: the run ended first (at "
                      "20 steps)"),
            std::string::npos)
      << said;
}

// With --replicas=2 a killed primary needs no checkpoint: its backup takes over, and the killed
// replica, started again, joins it. Nothing is lost: each shard ends with one update per step.
// The kill comes after 1,600 of the 4,000 updates (summed over both shards); each worker does at
// most 200 steps/s, so the 60% after it last at least 3 s on any machine, time for the takeover
// (1 s of silence) and for the killed replica to start again and join.
TEST(CommandTest, LaunchWithReplicasLosesNothingWhenAPrimaryIsKilled) {
  std::string dir = NewRunDir() + "/run";
  auto [code, output] =
      RunDaemon({"launch", "--workers=2", "--steps=1000", "--replicas=2", "--kill=ps:1@1600u",
                 "--worker_flags=--push_delay=fixed:0.005", "--run_dir=" + dir});
  EXPECT_EQ(code, 0) << output;
  for (const char* line :
       {"killed shard 1 (--kill after 1600 updates)",
        "shard 1 replica 0 exited with status 137: starting it again (it joins its peer as the "
        "backup)",
        "recovered 1 time(s) (0 update(s) lost"}) {
    EXPECT_NE(output.find(line), std::string::npos) << line << " missing from: " << output;
  }
  for (const char* stats : {"/stats-shard-1-0.json", "/stats-shard-1-1.json"}) {
    EXPECT_NE(ReadFile(dir + stats).find("\"version\": \"2000\""), std::string::npos) << stats;
  }
}

TEST(CommandTest, ExperimentRunsAMatrixAndWritesAReport) {
  std::string dir = NewRunDir() + "/reports/strag";  // parents made as needed
  // Runs bounded by progress (0.1 epochs: 47 steps per worker), so that each has data to report
  // on a machine of any speed.
  auto [code, output] =
      RunDaemon({"experiment", "--modes=async,sync-backup1", "--workers=2", "--stragglers=1:3",
                 "--seeds=1,2", "--epochs=0.1", "--hidden=32", "--report_dir=" + dir});
  EXPECT_EQ(code, 0) << output;
  std::string summary = ReadFile(dir + "/summary.md");
  // A row per configuration over its two seeds (mean ± sd), then one per run.
  EXPECT_NE(summary.find("| async_w2_strag1-3 | 2 | "), std::string::npos) << summary;
  EXPECT_NE(summary.find("| sync-backup1_w2_strag1-3 | 2 | "), std::string::npos) << summary;
  EXPECT_NE(summary.find(" ± "), std::string::npos) << summary;
  EXPECT_NE(summary.find("| async_w2_strag1-3_seed2 | "), std::string::npos) << summary;
  EXPECT_EQ(summary.find("failed"), std::string::npos) << summary;
  for (const char* f :
       {"/accuracy_vs_time.png", "/accuracy_vs_updates.png", "/accuracy_vs_epochs.png",
        "/training_loss.png", "/staleness.png", "/async_w2_strag1-3_seed1/staleness.csv",
        "/sync-backup1_w2_strag1-3_seed2/accuracy.csv"}) {
    EXPECT_TRUE(FileHasData(dir + f)) << f;
  }
  // --epochs: each worker of a sync run of 2 workers at batch 64 takes 0.05 x 60,000 / 128 = 24
  // steps; one worker makes every gradient mode the same SGD, so only the first runs.
  std::string epochs_dir = NewRunDir() + "/epochs";
  auto [epochs_code, epochs_output] =
      RunDaemon({"experiment", "--modes=sync,async", "--workers=1,2", "--epochs=0.05",
                 "--hidden=32", "--report_dir=" + epochs_dir});
  EXPECT_EQ(epochs_code, 0) << epochs_output;
  EXPECT_EQ(Column(LastLine(epochs_dir + "/sync_w2/worker-1.csv"), 0), 23);
  EXPECT_TRUE(FileHasData(epochs_dir + "/sync_w1/accuracy.csv"));
  EXPECT_FALSE(FileHasData(epochs_dir + "/async_w1/accuracy.csv"));
  auto [bad, why] = RunDaemon({"experiment", "--modes=hogwild"});
  EXPECT_NE(bad, 0);
  EXPECT_NE(why.find("unknown mode 'hogwild'"), std::string::npos) << why;
  // A run that fails (here: its worker cannot serve health where asked, which no dry run
  // checks) fails the command, after the report.
  std::string failing_dir = NewRunDir() + "/failing";
  auto [failed, failed_output] = RunDaemon(
      {"experiment", "--modes=async", "--workers=1", "--epochs=0.01", "--hidden=8",
       "--worker_flags=--health_host=256.1.1.1 --health_port=0 --insecure",
       "--report_dir=" + failing_dir});
  EXPECT_EQ(failed, 1) << failed_output;
  EXPECT_NE(failed_output.find("experiment: 1 of 1 runs FAILED"), std::string::npos)
      << failed_output;
  EXPECT_TRUE(FileHasData(failing_dir + "/summary.md"));
}

TEST(DaemonTest, SigtermStopsDaemonsWaitingOnAShardAtOnce) {
  LocalCluster cluster(ExecutableDir(), NewRunDir());
  // Never initialised: both wait for rank 0.
  ASSERT_TRUE(cluster.StartShards(1, "mlp:784-8-10", 2, {}).ok());
  ASSERT_TRUE(cluster.StartEvaluator({"--hidden=8"}).ok());
  ASSERT_TRUE(cluster.StartWorker(1, 2, {"--hidden=8"}).ok());
  // Both are waiting inside Pull once the shard holds two pulls.
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  while (Stats(cluster.ShardAddress(0)).pulls_waiting() < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(Stats(cluster.ShardAddress(0)).pulls_waiting(), 2);
  for (Subprocess* p : {cluster.evaluator(), cluster.worker(1)}) {
    ASSERT_TRUE(p->running());
    p->Signal(SIGTERM);
  }
  for (Subprocess* p : {cluster.evaluator(), cluster.worker(1)}) {
    absl::StatusOr<int> code = p->Wait(absl::Seconds(5));
    ASSERT_TRUE(code.ok()) << p->name() << " ignored SIGTERM while waiting on a shard";
    EXPECT_EQ(*code, 0) << p->name();
  }
}

TEST(DaemonTest, ALateInitialiserIsToldSoAndChangesNothing) {
  LocalCluster cluster(ExecutableDir(), NewRunDir());
  ASSERT_TRUE(cluster.StartShards(1, "flat:4", 1, {}).ok());
  ShardedClient first({cluster.ShardAddress(0)}, {"flat:4", 4, 1}, 0);
  ASSERT_TRUE(first.Register().ok());
  EXPECT_EQ(*first.Initialize({1, 2, 3, 4}), 1);
  EXPECT_EQ(*first.Initialize({9, 9, 9, 9}), 0);
  ShardedClient reader({cluster.ShardAddress(0)}, {"flat:4", 4, 1}, -1);
  std::vector<float> values(4);
  ASSERT_TRUE(reader.Pull(absl::MakeSpan(values)).ok());
  EXPECT_EQ(values, (std::vector<float>{1, 2, 3, 4}));
}

TEST(DaemonTest, WorkerGivesUpOnUnreachableShardsWithAReason) {
  auto [code, output] = RunDaemon({"worker", "--ps=127.0.0.1:1", "--retry_seconds=1",
                                   "--rpc_timeout_seconds=0.5", "--hidden=8"});
  std::string why = RunDaemon({"worker", "--ps=127.0.0.1:1", "--rpc_timeout_seconds=0.1"}).second;
  EXPECT_NE(why.find("--rpc_timeout_seconds must be >= 0.5"), std::string::npos) << why;
  EXPECT_EQ(code, 1);
  EXPECT_NE(output.find("worker: shard 0 (127.0.0.1:1)"), std::string::npos) << output;
}

}  // namespace
}  // namespace ps
