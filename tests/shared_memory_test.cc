// The shared-memory data plane (transport/shared_memory.h): segments and their regions' turns on
// their own, then a real `ps` on 127.0.0.1 whose co-located clients move tensors through
// shared memory, and raw requests that misuse a segment, which change nothing.
#include "transport/shared_memory.h"

#include <fcntl.h>
#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "transport/chunking.h"
#include "common/compression.h"
#include "transport/grpc_status.h"
#include "deploy/local_cluster.h"
#include "proto/ps.grpc.pb.h"
#include "proto/ps.pb.h"
#include "transport/shared_segments.h"
#include "tests/run_dir.h"
#include "tests/steps_in_turn.h"
#include "client/sharded_client.h"

namespace ps {
namespace {

using Phase = SharedRegion::Phase;

absl::Time Soon() { return absl::Now() + absl::Seconds(5); }

TEST(SharedSegmentTest, TwoMappingsShareTheBytes) {
  ASSERT_FALSE(ProcessSpaceId().empty());
  absl::StatusOr<SharedSegment> shard = SharedSegment::Create(1000);
  ASSERT_TRUE(shard.ok()) << shard.status();
  absl::StatusOr<SharedSegment> client =
      SharedSegment::Open(getpid(), shard->fd(), shard->nonce(), 1000);
  ASSERT_TRUE(client.ok()) << client.status();
  std::memcpy(client->push().data(), "gradient", 8);
  std::memcpy(shard->pull().data(), "weights", 7);
  EXPECT_EQ(std::string(shard->push().data(), 8), "gradient");
  EXPECT_EQ(std::string(client->pull().data(), 7), "weights");
  EXPECT_GE(client->pull().data(), client->push().data() + 1000);  // regions apart
  EXPECT_EQ(client->push().capacity(), 1000);
}

TEST(SharedSegmentTest, OpeningChecksWhatItOpens) {
  absl::StatusOr<SharedSegment> shard = SharedSegment::Create(4096);
  ASSERT_TRUE(shard.ok()) << shard.status();
  std::string wrong = shard->nonce();
  wrong[0] ^= 1;
  EXPECT_EQ(SharedSegment::Open(getpid(), shard->fd(), wrong, 4096).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(SharedSegment::Open(getpid(), shard->fd(), shard->nonce(), 8192).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(SharedSegment::Open(getpid(), shard->fd(), "short", 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Not a sealed segment: a file, and the read end of a pipe (opening it must not block).
  int file = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  int pipe_ends[2];
  ASSERT_EQ(pipe(pipe_ends), 0);
  for (int fd : {file, pipe_ends[0]}) {
    absl::Status s = SharedSegment::Open(getpid(), fd, shard->nonce(), 4096).status();
    EXPECT_FALSE(s.ok()) << "descriptor " << fd;
  }
  for (int fd : {file, pipe_ends[0], pipe_ends[1]}) close(fd);
  // A process that does not exist (pid_max is at most 2^22).
  EXPECT_EQ(SharedSegment::Open(1 << 23, 3, shard->nonce(), 4096).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(SharedSegmentTest, AClientCannotResizeIt) {
  absl::StatusOr<SharedSegment> shard = SharedSegment::Create(4096);
  ASSERT_TRUE(shard.ok());
  absl::StatusOr<SharedSegment> client =
      SharedSegment::Open(getpid(), shard->fd(), shard->nonce(), 4096);
  ASSERT_TRUE(client.ok());
  EXPECT_NE(ftruncate(client->fd(), 0), 0);  // the shard would fault reading past the end
  EXPECT_NE(ftruncate(client->fd(), 1 << 30), 0);
}

TEST(SharedRegionTest, TurnsFollowTheTicket) {
  absl::StatusOr<SharedSegment> segment = SharedSegment::Create(64);
  ASSERT_TRUE(segment.ok());
  SharedRegion region = segment->push();
  // A push: the client writes under ticket 1, the shard takes it.
  ASSERT_TRUE(region.Claim(Phase::kBusy, 1, Soon()));
  EXPECT_FALSE(region.Move(Phase::kReady, Phase::kBusy, 1));  // not handed over yet
  ASSERT_TRUE(region.Move(Phase::kBusy, Phase::kReady, 1));
  EXPECT_FALSE(region.Move(Phase::kReady, Phase::kBusy, 2));  // another request's ticket
  ASSERT_TRUE(region.Move(Phase::kReady, Phase::kBusy, 1));
  // While the shard reads, the client's next claim waits, and gives up at its deadline.
  EXPECT_FALSE(region.Claim(Phase::kBusy, 2, absl::Now() + absl::Milliseconds(20)));
  std::thread reader([&] {
    absl::SleepFor(absl::Milliseconds(50));
    region.Move(Phase::kBusy, Phase::kIdle, 1);
  });
  EXPECT_TRUE(region.Claim(Phase::kBusy, 2, Soon()));
  reader.join();
  // An abandoned request: the client handed over ticket 2, then wrote ticket 3 over it; the
  // shard's late call for ticket 2 finds the turn gone.
  ASSERT_TRUE(region.Move(Phase::kBusy, Phase::kReady, 2));
  ASSERT_TRUE(region.Claim(Phase::kBusy, 3, Soon()));
  EXPECT_FALSE(region.Move(Phase::kReady, Phase::kBusy, 2));
}

TEST(SharedRegionTest, AnIdleRegionGivesItsMemoryBackAndOnlyThen) {
  absl::StatusOr<SharedSegment> segment = SharedSegment::Create(1 << 20);
  ASSERT_TRUE(segment.ok());
  SharedRegion region = segment->pull();
  std::memset(region.data(), 7, 1 << 20);
  ASSERT_TRUE(region.Claim(Phase::kFilled, 4, Soon()));
  EXPECT_FALSE(region.DiscardIfIdle());  // filled: the client has yet to read it
  EXPECT_EQ(region.data()[12345], 7);
  ASSERT_TRUE(region.Move(Phase::kFilled, Phase::kIdle, 4));
  EXPECT_TRUE(region.DiscardIfIdle());
  EXPECT_EQ(region.data()[12345], 0);
  EXPECT_TRUE(region.Move(Phase::kIdle, Phase::kReady, 4));  // its turn is as it was
}

TEST(SharedSegmentsTest, UnusedSegmentsAreTrimmedAndTheLeastRecentlyUsedMakesRoom) {
  SharedSegments segments(/*max_segments=*/2, /*region_bytes=*/4096, /*idle=*/absl::Seconds(60));
  absl::StatusOr<SharedSegments::Attached> a = segments.Attach(0);
  absl::StatusOr<SharedSegments::Attached> b = segments.Attach(1);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(segments.Attach(2).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(segments.Attach(0).ok());  // a worker attaching again replaces its own
  EXPECT_EQ(segments.size(), 2);
  EXPECT_EQ(segments.Find(a->id, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(segments.Find(b->id, 0).status().code(), absl::StatusCode::kNotFound);  // not its own
  std::memset(b->segment->push().data(), 1, 4096);
  segments.Trim(absl::Now() + absl::Seconds(10), absl::Seconds(5));
  EXPECT_EQ(b->segment->push().data()[100], 0);
  // Idle for longer than `idle`, the one used longest ago makes room (when no call holds it).
  SharedSegments quick(1, 4096, absl::ZeroDuration());
  absl::StatusOr<SharedSegments::Attached> first = quick.Attach(0);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(quick.Attach(1).status().code(), absl::StatusCode::kResourceExhausted);  // held
  first->segment.reset();
  EXPECT_TRUE(quick.Attach(1).ok());
  EXPECT_EQ(quick.Find(first->id, 0).status().code(), absl::StatusCode::kNotFound);
}

// --- A real shard ---

constexpr int kParams = 1000;
const ModelIdentity kModel{"flat:1000", kParams, 1};

std::chrono::system_clock::time_point In(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

// One shard of kModel (SGD, lr 0.5) for two workers, initialised to 0.25 * i by worker 0.
class SharedMemoryShardTest : public ::testing::Test {
 protected:
  void Start(std::vector<std::string> flags = {}) {
    flags.insert(flags.end(), {"--optimizer=sgd", "--lr=0.5"});
    ASSERT_TRUE(cluster_.StartShards(1, kModel.fingerprint, 2, flags).ok());
    stub_ = v1::ParameterServer::NewStub(
        grpc::CreateChannel(cluster_.ShardAddress(0), grpc::InsecureChannelCredentials()));
    worker0_ = Client(0);
    ASSERT_TRUE(worker0_->Register().ok());
    for (int i = 0; i < kParams; ++i) initial_[i] = 0.25f * i;
    ASSERT_EQ(*worker0_->Initialize(initial_), 1);
  }
  std::unique_ptr<ShardedClient> Client(int worker, bool shared_memory = true,
                                        WireType type = WireType::kFloat32,
                                        Compression compression = {}) {
    ClientOptions options;
    options.shared_memory = shared_memory;
    options.push_type = options.pull_type = type;
    options.compression = compression;
    return std::make_unique<ShardedClient>(std::vector<std::string>{cluster_.ShardAddress(0)},
                                           kModel, worker, options);
  }
  v1::StatsResponse ShardStats() { return Stats(cluster_.ShardAddress(0)); }
  std::vector<float> Weights() {
    std::unique_ptr<ShardedClient> observer = Client(-1, /*shared_memory=*/false);
    std::vector<float> w(kParams);
    EXPECT_TRUE(observer->Pull(absl::MakeSpan(w)).ok());
    return w;
  }

  // A raw AttachSharedMemory as `worker` from where this process lives (or `space`).
  grpc::Status Attach(int worker, v1::AttachSharedMemoryResponse* response,
                      const std::string& space = ProcessSpaceId()) {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    v1::AttachSharedMemoryRequest request;
    request.set_worker_id(worker);
    request.mutable_model()->set_fingerprint(kModel.fingerprint);
    request.mutable_model()->set_total_params(kModel.total_params);
    request.mutable_model()->set_num_shards(kModel.num_shards);
    request.set_process_space(space);
    return stub_->AttachSharedMemory(&context, request, response);
  }
  absl::StatusOr<SharedSegment> Open(const v1::AttachSharedMemoryResponse& a) {
    return SharedSegment::Open(a.pid(), a.fd(), a.nonce(), a.region_bytes());
  }

  // A raw push as worker 0 (sequence `sequence`, base version 0) whose gradient is in `segment`'s
  // push region as `ticket`; `data`: bytes also sent in the stream.
  grpc::Status PushThrough(int64_t segment, uint64_t ticket, int64_t sequence,
                           const std::string& data = "", v1::DType dtype = v1::FLOAT32) {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    v1::PushResponse response;
    auto writer = stub_->Push(&context, &response);
    v1::PushChunk chunk;
    v1::PushHeader* h = chunk.mutable_header();
    h->set_worker_id(0);
    h->set_incarnation(worker0_->incarnation(0));
    h->set_sequence(sequence);
    h->set_offset(0);
    h->set_length(kParams);
    h->set_dtype(dtype);
    h->mutable_path()->set_shm_segment(segment);
    h->mutable_path()->set_shm_ticket(ticket);
    chunk.set_data(data);
    writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  }

  LocalCluster cluster_{ExecutableDir(), NewRunDir("shm")};
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
  std::unique_ptr<ShardedClient> worker0_;
  std::vector<float> initial_ = std::vector<float>(kParams);
};

TEST_F(SharedMemoryShardTest, CoLocatedClientsMoveTensorsThroughItWithTheSameResults) {
  Start();
  std::vector<float> gradient(kParams);
  for (int i = 0; i < kParams; ++i) gradient[i] = 0.001f * (i % 7);
  // Worker 0 through shared memory, worker 1 over gRPC, in turn: the same SGD steps.
  std::unique_ptr<ShardedClient> worker1 = Client(1, /*shared_memory=*/false);
  ASSERT_TRUE(worker1->Register().ok());
  std::vector<float> trained;
  ExpectStepsInTurnAgree(*worker0_, *worker1, initial_, gradient, 0.5f, &trained);
  if (HasFatalFailure()) return;
  v1::StatsResponse stats = ShardStats();
  EXPECT_EQ(stats.shm_pushes(), 2);
  EXPECT_EQ(stats.shm_pulls(), 3);
  EXPECT_EQ(stats.pushes_applied(), 4);
  EXPECT_EQ(stats.shm_segments(), 1);  // worker 1 asked for none

  // A 16-bit wire type goes through shared memory as it would over gRPC: the same rounding.
  std::unique_ptr<ShardedClient> half_shared = Client(-1, true, WireType::kBFloat16);
  std::unique_ptr<ShardedClient> half_grpc = Client(-1, false, WireType::kBFloat16);
  std::vector<float> through_memory(kParams), through_grpc(kParams);
  ASSERT_TRUE(half_shared->Register().ok() && half_grpc->Register().ok());
  ASSERT_TRUE(half_shared->Pull(absl::MakeSpan(through_memory)).ok());
  ASSERT_TRUE(half_grpc->Pull(absl::MakeSpan(through_grpc)).ok());
  EXPECT_EQ(through_memory, through_grpc);
  EXPECT_NE(through_memory, trained);  // rounded to bf16 indeed
  EXPECT_EQ(ShardStats().shm_pulls(), 4);
  // Leaving frees a worker's segment.
  ASSERT_TRUE(worker0_->Leave(absl::Seconds(10)).ok());
  EXPECT_EQ(ShardStats().shm_segments(), 1);  // the bf16 observer's
}

TEST_F(SharedMemoryShardTest, AShardThatSharesNoneServesOverGrpc) {
  Start({"--shm_clients=0"});
  std::vector<float> got(kParams), zero(kParams, 0.0f);
  ASSERT_TRUE(worker0_->Pull(absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, initial_);
  ASSERT_TRUE(worker0_->Push(zero, 0).ok());
  v1::AttachSharedMemoryResponse a;
  EXPECT_EQ(Attach(0, &a).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  v1::StatsResponse stats = ShardStats();
  EXPECT_EQ(stats.shm_pushes() + stats.shm_pulls() + stats.shm_segments(), 0);
  EXPECT_EQ(stats.pushes_applied(), 1);
}

TEST_F(SharedMemoryShardTest, ARefusedSegmentFallsBackToGrpc) {
  Start({"--shm_clients=1"});
  // Worker 0 holds the only segment; worker 1 is refused one and uses gRPC.
  std::unique_ptr<ShardedClient> worker1 = Client(1);
  ASSERT_TRUE(worker1->Register().ok());
  v1::AttachSharedMemoryResponse a;
  EXPECT_EQ(Attach(1, &a).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  std::vector<float> got(kParams), zero(kParams, 0.0f);
  ASSERT_TRUE(worker1->Push(zero, 0).ok());
  ASSERT_TRUE(worker1->Pull(absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, initial_);
  EXPECT_EQ(ShardStats().shm_pushes(), 0);

  // Worker 0's segment is taken from it (another process attached as worker 0): its next push
  // is refused as "shared memory lost", and the client sends it over gRPC at once.
  ASSERT_TRUE(Attach(0, &a).ok());
  ASSERT_TRUE(worker0_->Push(zero, 0).ok());
  ASSERT_TRUE(worker0_->Pull(absl::MakeSpan(got)).ok());
  v1::StatsResponse stats = ShardStats();
  EXPECT_EQ(stats.pushes_applied(), 2);
  EXPECT_EQ(stats.pushes_rejected(), 0);  // falling back is no rejection
  EXPECT_EQ(stats.shm_pushes(), 0);
  EXPECT_EQ(stats.shm_pulls(), 0);
}

TEST_F(SharedMemoryShardTest, MisusedSegmentsChangeNothing) {
  Start();
  v1::AttachSharedMemoryResponse a;
  // Another host (or PID namespace), an unknown worker: no segment.
  EXPECT_EQ(Attach(0, &a, "another-host").error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Attach(7, &a).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(Attach(0, &a).ok());
  absl::StatusOr<SharedSegment> segment = Open(a);
  ASSERT_TRUE(segment.ok()) << segment.status();
  SharedRegion push = segment->push();
  auto write = [&](float value, uint64_t ticket) {
    ASSERT_TRUE(push.Claim(Phase::kBusy, ticket, Soon()));
    std::vector<float> g(kParams, value);
    std::memcpy(push.data(), g.data(), sizeof(float) * kParams);
    ASSERT_TRUE(push.Move(Phase::kBusy, Phase::kReady, ticket));
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  write(nan, 1);
  grpc::Status s = PushThrough(a.segment(), 1, 0);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  write(1.0f, 2);
  s = PushThrough(a.segment() ^ 1, 2, 0);  // a segment that does not exist
  EXPECT_TRUE(IsSharedMemoryLost(s)) << s.error_message();
  s = PushThrough(a.segment(), 5, 0);  // a ticket the region does not hold
  EXPECT_TRUE(IsSharedMemoryLost(s)) << s.error_message();
  s = PushThrough(a.segment(), 2, 0, std::string(AsBytes(std::vector<float>(kParams, 1.0f))));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  // A pull naming a segment that is not its client's.
  {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    v1::PullRequest r;
    r.set_worker_id(1);
    r.mutable_model()->set_fingerprint(kModel.fingerprint);
    r.mutable_model()->set_total_params(kModel.total_params);
    r.mutable_model()->set_num_shards(1);
    r.mutable_path()->set_shm_segment(a.segment());
    r.mutable_path()->set_shm_ticket(1);
    auto reader = stub_->Pull(&context, r);
    v1::PullChunk chunk;
    while (reader->Read(&chunk)) {
    }
    EXPECT_TRUE(IsSharedMemoryLost(reader->Finish()));
  }
  EXPECT_EQ(Weights(), initial_);
  v1::StatsResponse stats = ShardStats();
  EXPECT_EQ(stats.version(), 0);
  EXPECT_EQ(stats.shm_pushes(), 0);

  // The same request done right is applied once.
  write(1.0f, 9);
  s = PushThrough(a.segment(), 9, 0);
  ASSERT_TRUE(s.ok()) << s.error_message();
  std::vector<float> w = Weights();
  EXPECT_EQ(w[10], initial_[10] - 0.5f);
  EXPECT_EQ(ShardStats().shm_pushes(), 1);
}

// Compressed pushes go through shared memory when they fit the push region (sized for float32)
// and over gRPC when not, and apply as they would over gRPC; a malformed one changes nothing.
TEST_F(SharedMemoryShardTest, CompressedPushesGoThroughItWhenTheyFit) {
  Start();
  std::vector<float> gradient(kParams);
  for (int i = 0; i < kParams; ++i) gradient[i] = 0.01f * ((i * 37) % 11) - 0.05f;
  std::vector<float> expected = initial_;
  // The shard applies decode(C(g)) (a client's first push: no residual yet), lr 0.5.
  auto apply = [&](const Compression& c) {
    std::vector<float> rest = gradient, decoded(kParams);
    CompressedTensor sent;
    Compress(c, absl::MakeSpan(rest), &sent);
    ChunkAssembler assembler(absl::MakeSpan(decoded),
                             PayloadFormat{WireType::kFloat32, c.compressor, sent.pairs});
    ASSERT_TRUE(assembler.Append(sent.bytes).ok());
    for (int i = 0; i < kParams; ++i) expected[i] -= 0.5f * decoded[i];
  };
  const Compression onebit{Compressor::kOneBit}, dense_topk{Compressor::kTopK, 0.9};
  std::vector<float> got(kParams);
  std::unique_ptr<ShardedClient> shared = Client(1, true, WireType::kFloat32, onebit);
  std::unique_ptr<ShardedClient> socket = Client(-1, false);  // reads only
  ASSERT_TRUE(shared->Register().ok());
  ASSERT_TRUE(shared->Pull(absl::MakeSpan(got)).ok());
  ASSERT_TRUE(shared->Push(gradient).ok());
  apply(onebit);
  ASSERT_TRUE(socket->Pull(absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, expected);
  EXPECT_EQ(ShardStats().shm_pushes(), 1);
  // topk:0.9 takes 8 bytes for each of 900 values: more than the region's 4,000. (Worker 1
  // again: worker 0's process stays worker0_, which pushes by hand below.)
  shared.reset();
  std::unique_ptr<ShardedClient> too_big = Client(1, true, WireType::kFloat32, dense_topk);
  ASSERT_TRUE(too_big->Register().ok());
  ASSERT_TRUE(too_big->Pull(absl::MakeSpan(got)).ok());
  ASSERT_TRUE(too_big->Push(gradient).ok());
  apply(dense_topk);
  ASSERT_TRUE(socket->Pull(absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, expected);
  v1::StatsResponse stats = ShardStats();
  EXPECT_EQ(stats.shm_pushes(), 1);
  EXPECT_EQ(stats.pushes_applied(), 2);

  // A onebit payload whose first scale is NaN, written into the region by hand: refused.
  v1::AttachSharedMemoryResponse a;
  ASSERT_TRUE(Attach(0, &a).ok());
  absl::StatusOr<SharedSegment> segment = Open(a);
  ASSERT_TRUE(segment.ok()) << segment.status();
  SharedRegion push = segment->push();
  std::vector<float> rest = gradient;
  CompressedTensor bad;
  Compress(onebit, absl::MakeSpan(rest), &bad);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bad.bytes.data(), &nan, sizeof(nan));
  ASSERT_TRUE(push.Claim(Phase::kBusy, 1, Soon()));
  std::memcpy(push.data(), bad.bytes.data(), bad.bytes.size());
  ASSERT_TRUE(push.Move(Phase::kBusy, Phase::kReady, 1));
  grpc::Status refused = PushThrough(a.segment(), 1, 5, "", v1::ONEBIT);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find("has scale nan"), std::string::npos)
      << refused.error_message();
  EXPECT_EQ(Weights(), got);
  EXPECT_EQ(ShardStats().pushes_applied(), 2);
}

// A client writing its segment while the shard reads it (NaN and 1.0 in turn, now and then a
// made-up state word): the shard copies a push out before checking it, so what it applies is
// exactly what it checked. Every push is applied whole (all 1.0) or refused.
TEST_F(SharedMemoryShardTest, AClientScribblingOnItsSegmentGetsNothingPastTheChecks) {
  Start();
  v1::AttachSharedMemoryResponse a;
  ASSERT_TRUE(Attach(0, &a).ok());
  absl::StatusOr<SharedSegment> segment = Open(a);
  ASSERT_TRUE(segment.ok()) << segment.status();
  SharedRegion push = segment->push();
  // Its state word, where transport/shared_memory.cc puts it (byte 64 of the header page).
  auto* state = reinterpret_cast<std::atomic<uint64_t>*>(push.data() - 4096 + 64);
  const std::vector<float> ones(kParams, 1.0f);
  const std::vector<float> nans(kParams, std::numeric_limits<float>::quiet_NaN());
  // Only ever NaN or 1.0 in the region, from the first push on.
  std::memcpy(push.data(), nans.data(), sizeof(float) * kParams);
  std::atomic<bool> stop{false};
  std::thread scribbler([&] {
    absl::Time scribbled = absl::Now();
    for (uint64_t i = 0; !stop.load(); ++i) {
      std::memcpy(push.data(), (i % 2 == 0 ? nans : ones).data(), sizeof(float) * kParams);
      if (absl::Now() - scribbled > absl::Milliseconds(20)) {
        state->store(i * 0x9e3779b97f4a7c15ull);
        scribbled = absl::Now();
      }
    }
  });
  int64_t applied = 0, refused = 0, lost = 0;
  for (uint64_t ticket = 1; ticket <= 300; ++ticket) {
    if (!push.Claim(Phase::kBusy, ticket, Soon())) continue;  // the scribbler left it "busy"
    push.Move(Phase::kBusy, Phase::kReady, ticket);
    grpc::Status s = PushThrough(a.segment(), ticket, applied);
    if (s.ok()) {
      ++applied;
    } else if (IsSharedMemoryLost(s)) {
      ++lost;
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
      ++refused;
    }
  }
  stop = true;
  scribbler.join();
  std::cout << applied << " applied, " << refused << " refused, " << lost << " lost\n";
  EXPECT_GT(refused, 0);
  std::vector<float> w = Weights();
  for (int i = 0; i < kParams; ++i) {
    ASSERT_EQ(w[i], initial_[i] - 0.5f * applied) << "weight " << i;
  }
  EXPECT_EQ(ShardStats().version(), applied);
}

}  // namespace
}  // namespace ps
