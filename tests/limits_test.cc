// Tests of the shard's resource limits: a real `ps` on 127.0.0.1 (or the same ShardServer in this
// process), driven by raw gRPC clients that hold pulls at a barrier, stall streams, or send bytes
// that are no request at all.
#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/version.h"
#include "transport/chunking.h"
#include "transport/security.h"
#include "deploy/local_cluster.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "proto/ps.grpc.pb.h"
#include "proto/ps.pb.h"
#include "server/rpc/call_limits.h"
#include "tests/in_process_shard.h"
#include "tests/run_dir.h"
#include "client/sharded_client.h"

namespace ps {
namespace {

const ModelIdentity kModel{"flat:1000", 1000, 1};

// The number of threads of a process, from /proc.
int Threads(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(in, line);) {
    int n = 0;
    if (line.rfind("Threads:", 0) == 0 && absl::SimpleAtoi(line.substr(8), &n)) return n;
  }
  return -1;
}

std::chrono::system_clock::time_point In(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

// One shard of kModel for two workers, initialised to 0..999 by worker 0.
class LimitsTest : public ::testing::Test {
 protected:
  void Start(const std::vector<std::string>& flags) {
    ASSERT_TRUE(cluster_.StartShards(1, kModel.fingerprint, 2, flags).ok());
    channel_ = grpc::CreateChannel(cluster_.ShardAddress(0), grpc::InsecureChannelCredentials());
    stub_ = v1::ParameterServer::NewStub(channel_);
    worker0_ = std::make_unique<ShardedClient>(std::vector<std::string>{cluster_.ShardAddress(0)},
                                               kModel, 0);
    ASSERT_TRUE(worker0_->Register().ok());
    for (int i = 0; i < 1000; ++i) initial_[i] = static_cast<float>(i);
    ASSERT_EQ(*worker0_->Initialize(initial_), 1);
  }
  pid_t pid() { return cluster_.shards()[0].pid(); }

  v1::PullRequest PullAs(int worker) const {
    v1::PullRequest r;
    r.set_worker_id(worker);
    r.mutable_model()->set_fingerprint(kModel.fingerprint);
    r.mutable_model()->set_total_params(kModel.total_params);
    r.mutable_model()->set_num_shards(kModel.num_shards);
    return r;
  }

  // The weights as an observer sees them.
  std::vector<float> Weights() {
    ShardedClient observer({cluster_.ShardAddress(0)}, kModel, -1);
    std::vector<float> w(1000);
    EXPECT_TRUE(observer.Pull(absl::MakeSpan(w)).ok());
    return w;
  }

  // A push stream as worker 0 that sends its header and `floats` values, then stalls.
  struct StalledPush {
    grpc::ClientContext context;
    v1::PushResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::PushChunk>> writer;
  };
  std::unique_ptr<StalledPush> StartStalledPush(int floats) {
    auto p = std::make_unique<StalledPush>();
    p->context.set_deadline(In(absl::Seconds(60)));
    p->writer = stub_->Push(&p->context, &p->response);
    v1::PushChunk chunk;
    v1::PushHeader* h = chunk.mutable_header();
    h->set_worker_id(0);
    h->set_incarnation(worker0_->incarnation(0));
    h->set_offset(0);
    h->set_length(1000);
    h->set_dtype(v1::FLOAT32);
    chunk.set_data(std::string(AsBytes(std::vector<float>(floats, 1.0f))));
    p->writer->Write(chunk);
    return p;
  }

  LocalCluster cluster_{ExecutableDir(), NewRunDir("limits")};
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
  std::unique_ptr<ShardedClient> worker0_;
  std::vector<float> initial_ = std::vector<float>(1000);
};

// The end of a call made with the callback API: its status, once gRPC is done with it.
class CallEnd {
 public:
  grpc::Status Wait() {
    EXPECT_TRUE(done_.WaitForNotificationWithTimeout(absl::Seconds(150)));
    return status_;
  }
  bool done() const { return done_.HasBeenNotified(); }
  void Cancel() { context_.TryCancel(); }

 protected:
  void End(const grpc::Status& s) {
    status_ = s;
    done_.Notify();
  }
  grpc::ClientContext context_;

 private:
  grpc::Status status_;
  absl::Notification done_;
};

// Reads one Pull to its end with the callback client API and reports its status.
class PullReader : public grpc::ClientReadReactor<v1::PullChunk>, public CallEnd {
 public:
  PullReader(v1::ParameterServer::Stub* stub, v1::PullRequest request,
             const std::string& token = "")
      : request_(std::move(request)) {
    context_.set_deadline(In(absl::Seconds(120)));
    if (!token.empty()) context_.AddMetadata(kAuthorizationMetadata, BearerValue(token));
    stub->async()->Pull(&context_, &request_, this);
    StartRead(&chunk_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (ok) StartRead(&chunk_);
  }
  void OnDone(const grpc::Status& s) override { End(s); }

 private:
  const v1::PullRequest request_;  // read by gRPC until the call ends
  v1::PullChunk chunk_;
};

TEST_F(LimitsTest, PullsHeldAtABarrierHoldNoThreadsAndTheShardStillAnswers) {
  // Before: 1,000 pulls held at a sync barrier made 1,013 server threads.
  Start({"--consistency=sync", "--optimizer=sgd", "--lr=1", "--max_pulls=1100",
         "--lease_seconds=600"});
  ShardedClient worker1({cluster_.ShardAddress(0)}, kModel, 1);
  ASSERT_TRUE(worker1.Register().ok());
  ASSERT_TRUE(worker0_->Push(std::vector<float>(1000, 1.0f), 0).ok());  // waits for worker 1
  const int before = Threads(pid());
  std::vector<std::unique_ptr<PullReader>> held;
  for (int i = 0; i < 1000; ++i)
    held.push_back(std::make_unique<PullReader>(stub_.get(), PullAs(0)));
  // All of them reach the shard and wait there.
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  v1::StatsResponse stats;
  while (stats.pulls_waiting() < 1000 && absl::Now() < deadline) {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    ASSERT_TRUE(stub_->GetStats(&context, v1::StatsRequest(), &stats).ok());
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_EQ(stats.pulls_waiting(), 1000) << stats.ShortDebugString();
  const int during = Threads(pid());
  // The shard answers health and statistics while they wait.
  auto health = grpc::health::v1::Health::NewStub(channel_);
  absl::Time start = absl::Now();
  grpc::ClientContext health_context;
  health_context.set_deadline(In(absl::Seconds(10)));
  grpc::health::v1::HealthCheckResponse serving;
  ASSERT_TRUE(
      health->Check(&health_context, grpc::health::v1::HealthCheckRequest(), &serving).ok());
  absl::Duration health_latency = absl::Now() - start;
  start = absl::Now();
  grpc::ClientContext stats_context;
  stats_context.set_deadline(In(absl::Seconds(10)));
  ASSERT_TRUE(stub_->GetStats(&stats_context, v1::StatsRequest(), &stats).ok());
  absl::Duration stats_latency = absl::Now() - start;
  std::cout << "1000 held pulls: ps threads " << before << " before, " << during
            << " during; health answered in " << health_latency << ", GetStats in " << stats_latency
            << "\n";
  EXPECT_LT(during - before, 50) << "held pulls should not hold threads";
  EXPECT_EQ(stats.version(), 0);
  // Worker 1's gradient closes the round: every held pull is answered with the new weights.
  ASSERT_TRUE(worker1.Push(std::vector<float>(1000, 1.0f)).ok());
  int ok = 0;
  for (auto& p : held) ok += p->Wait().ok();
  EXPECT_EQ(ok, 1000);
}

TEST_F(LimitsTest, StalledPushStreamsAreBoundedAndCancelledAndChangeNothing) {
  // Before: 1,000 push streams that sent a shard and never half-closed took 1.9 GB and 1,013
  // threads, and never timed out.
  Start({"--optimizer=sgd", "--max_streams=8", "--stream_idle_seconds=1"});
  std::vector<std::unique_ptr<StalledPush>> stalled;
  for (int i = 0; i < 20; ++i) stalled.push_back(StartStalledPush(500));
  int refused = 0, cancelled = 0;
  for (auto& p : stalled) {
    grpc::Status s = p->writer->Finish();  // returns once the server ended the call
    refused += s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    cancelled += s.error_code() == grpc::StatusCode::CANCELLED;
  }
  std::cout << refused << " refused at once, " << cancelled << " cancelled when idle\n";
  EXPECT_EQ(refused + cancelled, 20);
  EXPECT_GE(refused, 12);
  std::vector<float> w = Weights();
  EXPECT_EQ(std::memcmp(w.data(), initial_.data(), sizeof(float) * 1000), 0);
  // The slots are free again: a real push goes through.
  ASSERT_TRUE(worker0_->Push(std::vector<float>(1000, 1.0f)).ok());
}

TEST(PullLimitsTest, APullWhoseReaderStopsReadingIsCancelled) {
  // Before: 30 pulls that were never read pinned 30 threads and 550 MB for 65 s. A shard of
  // 64 MB is far more than the transport's flow-control window, so the shard's writes stall.
  LocalCluster cluster(ExecutableDir(), NewRunDir("limits"));
  const ModelIdentity model{"flat:16000000", 16000000, 1};
  ASSERT_TRUE(cluster.StartShards(1, model.fingerprint, 1, {"--stream_idle_seconds=1"}).ok());
  ShardedClient owner({cluster.ShardAddress(0)}, model, 0);
  ASSERT_TRUE(owner.Register().ok());
  ASSERT_TRUE(owner.Initialize(std::vector<float>(16000000, 1.0f)).ok());
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(cluster.ShardAddress(0), grpc::InsecureChannelCredentials()));
  v1::PullRequest request;
  request.set_worker_id(-1);
  request.mutable_model()->set_fingerprint(model.fingerprint);
  request.mutable_model()->set_total_params(model.total_params);
  request.mutable_model()->set_num_shards(1);
  grpc::ClientContext context;
  context.set_deadline(In(absl::Seconds(60)));
  absl::Time start = absl::Now();
  auto reader = stub->Pull(&context, request);
  v1::PullChunk first;
  ASSERT_TRUE(reader->Read(&first));  // the pull was answered; now this client stops reading
  absl::SleepFor(absl::Seconds(3));
  while (reader->Read(&first)) {  // what the transport had buffered, then the end
  }
  grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << status.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "ended by the client's deadline instead";
}

TEST_F(LimitsTest, EndlessEmptyChunksAreRefused) {
  Start({"--optimizer=sgd"});
  grpc::ClientContext context;
  context.set_deadline(In(absl::Seconds(30)));
  v1::PushResponse response;
  auto writer = stub_->Push(&context, &response);
  v1::PushChunk chunk;
  chunk.mutable_header()->set_worker_id(0);
  chunk.mutable_header()->set_incarnation(worker0_->incarnation(0));
  chunk.mutable_header()->set_length(1000);
  chunk.mutable_header()->set_dtype(v1::FLOAT32);
  chunk.set_data(std::string(AsBytes(std::vector<float>(10, 1.0f))));
  writer->Write(chunk);
  v1::PushChunk empty;
  for (int i = 0; i < 100000 && writer->Write(empty); ++i) {
  }
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("empty chunk"), std::string::npos) << s.error_message();
}

TEST(InitialiseLimitsTest, AStalledInitialiserDoesNotLockOutTheRealOne) {
  // Before: an Initialize header alone held the one initialisation slot with no deadline, and
  // the real initialiser was refused for 60 s and gave up.
  // The shard runs in this process.
  ShardServerConfig config = ShardOf(kModel.fingerprint, 1);
  config.limits.stream_idle = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<InProcessShard>> shard = InProcessShard::Start(std::move(config));
  ASSERT_TRUE(shard.ok()) << shard.status();
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel((*shard)->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(In(absl::Seconds(60)));
  v1::InitializeResponse response;
  auto stalled = stub->Initialize(&context, &response);
  v1::InitializeChunk chunk;
  chunk.mutable_header()->mutable_model()->set_fingerprint(kModel.fingerprint);
  chunk.mutable_header()->mutable_model()->set_total_params(kModel.total_params);
  chunk.mutable_header()->mutable_model()->set_num_shards(1);
  chunk.mutable_header()->set_length(1000);
  chunk.mutable_header()->set_dtype(v1::FLOAT32);
  chunk.set_data(std::string(AsBytes(std::vector<float>(10, 9.0f))));
  ASSERT_TRUE(stalled->Write(chunk));
  absl::SleepFor(absl::Milliseconds(200));  // it holds the slot now (or soon: either is fine)
  ClientOptions options;
  options.retry_for = absl::Seconds(30);
  ShardedClient real({(*shard)->address()}, kModel, 0, options);
  ASSERT_TRUE(real.Register().ok());
  std::vector<float> values(1000, 0.5f);
  absl::StatusOr<int> applied = real.Initialize(values);
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ(*applied, 1);
  EXPECT_EQ(stalled->Finish().error_code(), grpc::StatusCode::CANCELLED);
  std::vector<float> now(1000);
  ASSERT_TRUE(real.Pull(absl::MakeSpan(now)).ok());
  EXPECT_EQ(now, values);
}

// Statistics of more workers than one GetStats page (256), with shards that know different
// workers: FetchStats (psctl status, the tools) joins the pages, every worker once, in order.
TEST(StatsPagesTest, FetchStatsListsEveryWorkerOfEveryShard) {
  const ModelIdentity model{"flat:1000", 1000, 2};
  // Both shards run in this process.
  std::vector<std::unique_ptr<InProcessShard>> shards;
  for (int shard = 0; shard < 2; ++shard) {
    absl::StatusOr<std::unique_ptr<InProcessShard>> started =
        InProcessShard::Start(ShardOf(model.fingerprint, 300, shard, 2));
    ASSERT_TRUE(started.ok()) << started.status();
    shards.push_back(*std::move(started));
  }
  for (int shard = 0; shard < 2; ++shard) {
    auto stub = v1::ParameterServer::NewStub(
        grpc::CreateChannel(shards[shard]->address(), grpc::InsecureChannelCredentials()));
    for (int w = 0; w < 300; ++w) {
      if (shard == 1 && w >= 100 && w < 200) continue;  // shard 1 never heard of 100..199
      grpc::ClientContext context;
      context.set_deadline(In(absl::Seconds(10)));
      v1::RegisterRequest request;
      request.set_worker_id(w);
      request.mutable_model()->set_fingerprint(model.fingerprint);
      request.mutable_model()->set_total_params(model.total_params);
      request.mutable_model()->set_num_shards(2);
      StampRelease(&request);
      v1::RegisterResponse response;
      ASSERT_TRUE(stub->Register(&context, request, &response).ok());
    }
  }
  ShardedClient observer({shards[0]->address(), shards[1]->address()}, model, -1);
  absl::StatusOr<std::vector<v1::StatsResponse>> stats = observer.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  for (int shard = 0; shard < 2; ++shard) {
    const auto& workers = (*stats)[shard].workers();
    ASSERT_EQ(workers.size(), shard == 0 ? 300 : 200);
    for (int i = 1; i < workers.size(); ++i) {
      EXPECT_LT(workers[i - 1].worker_id(), workers[i].worker_id());
    }
    EXPECT_EQ(workers[workers.size() - 1].worker_id(), 299);
    EXPECT_EQ((*stats)[shard].registered_workers(), shard == 0 ? 300 : 200);
  }
}

TEST(CallLimitTest, OneWorkerCannotTakeEveryPlace) {
  CallLimit limit("streams", /*max_calls=*/5, /*max_per_worker=*/2);
  std::vector<CallLimit::Slot> held;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<CallLimit::Slot> slot = limit.TryAcquire(7);
    ASSERT_TRUE(slot.ok()) << slot.status();
    held.push_back(*std::move(slot));
  }
  absl::Status third = limit.TryAcquire(7).status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.message().find("worker 7 already has 2 streams"), std::string::npos) << third;
  // Others still get in, up to the total; callers without a worker's token count only there.
  ASSERT_TRUE(limit.TryAcquire(1).ok());  // released at once
  for (int worker : {1, -1, -1}) {
    absl::StatusOr<CallLimit::Slot> slot = limit.TryAcquire(worker);
    ASSERT_TRUE(slot.ok()) << slot.status();
    held.push_back(*std::move(slot));
  }
  EXPECT_EQ(limit.in_use(), 5);
  absl::Status full = limit.TryAcquire(2).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("already serves 5 streams"), std::string::npos) << full;
  held.erase(held.begin());  // one of worker 7's ends
  EXPECT_EQ(limit.in_use(), 4);
  absl::StatusOr<CallLimit::Slot> again = limit.TryAcquire(7);
  ASSERT_TRUE(again.ok()) << again.status();
  held.push_back(*std::move(again));
  held.clear();  // every place given back, per worker too
  EXPECT_EQ(limit.in_use(), 0);
  std::vector<CallLimit::Slot> observers;
  for (int i = 0; i < 2; ++i) observers.push_back(*limit.TryAcquire(Caller::kNoWorker));
  absl::Status third_observer = limit.TryAcquire(Caller::kNoWorker).status();
  EXPECT_NE(third_observer.message().find("the job's observers and operator already have 2"),
            std::string::npos)
      << third_observer;
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(limit.TryAcquire(7).ok());
  // Without per-worker identity (kAnyWorker) only the total counts.
  for (int i = 0; i < 3; ++i) observers.push_back(*limit.TryAcquire(Caller::kAnyWorker));
  EXPECT_EQ(limit.in_use(), 5);
}

// A Push stream opened with `token` that sends nothing: it holds a place at the shard until the
// shard ends it (refused at once, or idle for --stream_idle_seconds) or Cancel.
class HeldPush : public grpc::ClientWriteReactor<v1::PushChunk>, public CallEnd {
 public:
  HeldPush(v1::ParameterServer::Stub* stub, const std::string& token) {
    context_.set_deadline(In(absl::Seconds(120)));
    context_.AddMetadata(kAuthorizationMetadata, BearerValue(token));
    stub->async()->Push(&context_, &response_, this);
    StartCall();
  }
  void OnDone(const grpc::Status& s) override { End(s); }

 private:
  v1::PushResponse response_;
};

// How many of `calls` have ended, once `count` have or after `timeout`.
template <typename Call>
int WaitUntilEnded(const std::vector<std::unique_ptr<Call>>& calls, int count,
                   absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int ended = 0;
    for (const auto& c : calls) ended += c->done();
    if (ended >= count || absl::Now() > deadline) return ended;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

TEST(WorkerQuotaTest, OneWorkerHoldingCallsOpenCannotStopTheOthers) {
  // Before: with the job's token, 10 push streams held open took every place of --max_streams
  // (2W+4, per shard) and stopped every worker's training for the 30 s idle limit; held pulls
  // could do the same to --max_pulls. With per-worker identity, one worker's token holds at most
  // --max_calls_per_worker (4) of each at a shard.
  const std::string dir = NewRunDir("quota");
  const std::string job_token = "job-7d3f9a1c5e2b8d40";
  std::ofstream(dir + "/token") << job_token << "\n";
  ClusterSecurity security;
  security.token_file = dir + "/token";
  security.worker_identity = true;
  LocalCluster cluster(ExecutableDir(), dir, security);
  ASSERT_TRUE(cluster.StartShards(1, kModel.fingerprint, 2, {"--optimizer=sgd", "--lr=1"}).ok());
  const std::vector<std::string> address = {cluster.ShardAddress(0)};
  auto worker = [&](int rank) {
    ClientOptions options;
    options.security.token = WorkerToken(job_token, rank);
    return std::make_unique<ShardedClient>(address, kModel, rank, options);
  };
  std::unique_ptr<ShardedClient> worker0 = worker(0), worker1 = worker(1);
  ASSERT_TRUE(worker0->Register().ok());
  ASSERT_TRUE(worker1->Register().ok());

  // Before the model is initialised, worker 1 opens 10 push streams that send nothing and 30
  // pulls, which the shard holds until it is initialised.
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(address[0], grpc::InsecureChannelCredentials()));
  v1::PullRequest held_pull;
  held_pull.set_worker_id(1);
  held_pull.mutable_model()->set_fingerprint(kModel.fingerprint);
  held_pull.mutable_model()->set_total_params(kModel.total_params);
  held_pull.mutable_model()->set_num_shards(kModel.num_shards);
  std::vector<std::unique_ptr<HeldPush>> pushes;
  std::vector<std::unique_ptr<PullReader>> pulls;
  for (int i = 0; i < 10; ++i) {
    pushes.push_back(std::make_unique<HeldPush>(stub.get(), WorkerToken(job_token, 1)));
  }
  for (int i = 0; i < 30; ++i) {
    pulls.push_back(std::make_unique<PullReader>(stub.get(), held_pull, WorkerToken(job_token, 1)));
  }
  // All but 4 of each are refused at once, saying why.
  EXPECT_EQ(WaitUntilEnded(pushes, 6, absl::Seconds(20)), 6);
  EXPECT_EQ(WaitUntilEnded(pulls, 26, absl::Seconds(20)), 26);
  auto expect_refused = [](const auto& calls, const std::string& why) {
    for (const auto& call : calls) {
      if (!call->done()) continue;
      grpc::Status s = call->Wait();
      EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
      EXPECT_NE(s.error_message().find(why), std::string::npos) << s.error_message();
    }
  };
  expect_refused(pushes, "worker 1 already has 4 streams");
  expect_refused(pulls, "worker 1 already has 4 pulls");

  // Worker 0 initialises the model and trains on meanwhile, without waiting for worker 1's held
  // streams (they end only at the 30 s idle limit).
  const absl::Time start = absl::Now();
  ASSERT_EQ(*worker0->Initialize(std::vector<float>(1000, 0.0f)), 1);
  std::vector<float> weights(1000);
  for (int step = 0; step < 20; ++step) {
    absl::StatusOr<ShardedClient::Versions> pulled = worker0->Pull(absl::MakeSpan(weights));
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    absl::StatusOr<ShardedClient::PushSummary> pushed =
        worker0->Push(std::vector<float>(1000, 1.0f));
    ASSERT_TRUE(pushed.ok()) << pushed.status();
  }
  const absl::Duration took = absl::Now() - start;
  std::cout << "worker 0's initialisation and 20 steps beside worker 1's held streams: " << took
            << "\n";
  EXPECT_LT(took, absl::Seconds(15));
  ASSERT_TRUE(worker0->Pull(absl::MakeSpan(weights)).ok());
  EXPECT_EQ(weights[0], -20.0f);
  EXPECT_EQ(weights[999], -20.0f);
  for (auto& p : pushes) p->Cancel();
  for (auto& p : pulls) p->Cancel();
  for (auto& p : pushes) p->Wait();
  for (auto& p : pulls) p->Wait();
}

}  // namespace
}  // namespace ps
