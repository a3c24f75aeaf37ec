// The path conformance suite (client/tensor_path.h): every way a shard's part of a push or a pull
// travels (gRPC, shared memory, the data plane) against a shard served in this process, for the
// same cases: exact values both ways, a part whose values are still being filled in, one dropped
// before it was final, a deadline, a shard that restarted, bad input, a cut connection, and
// compression around the path (client/compressed_path.h).
#include "client/tensor_path.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/compressed_path.h"
#include "client/grpc_path.h"
#include "client/shard_call.h"
#include "client/shard_session.h"
#include "common/model_spec.h"
#include "tests/in_process_shard.h"

namespace ps {
namespace {

enum class Kind { kGrpc, kSharedMemory, kDataPlane };

std::string KindName(const testing::TestParamInfo<Kind>& info) {
  switch (info.param) {
    case Kind::kGrpc:
      return "Grpc";
    case Kind::kSharedMemory:
      return "SharedMemory";
    case Kind::kDataPlane:
      return "DataPlane";
  }
  return "?";
}

// More than one 1 MiB gRPC chunk, one data-plane stripe.
constexpr int64_t kValues = (int64_t{1} << 18) + 7;
constexpr float kLr = 0.5f;

class TensorPathTest : public testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    ShardServerConfig config = ShardOf(absl::StrCat("flat:", kValues), /*num_workers=*/1);
    config.shard.learning_rate.base = kLr;
    absl::StatusOr<std::unique_ptr<InProcessShard>> shard = InProcessShard::Start(config);
    ASSERT_TRUE(shard.ok()) << shard.status();
    shard_ = *std::move(shard);
    absl::StatusOr<ModelIdentity> model = ParseModelSpec(absl::StrCat("flat:", kValues), 1);
    ASSERT_TRUE(model.ok());
    model_.set_fingerprint(model->fingerprint);
    model_.set_total_params(model->total_params);
    model_.set_num_shards(1);
    options_.shared_memory = GetParam() == Kind::kSharedMemory;
    options_.data_plane = GetParam() == Kind::kDataPlane;
    session_ =
        std::make_unique<ShardSession>(0, shard_->address(), Range{0, kValues},
                                       ShardSession::Client{0, model_, "", &options_, &threads_});
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    ASSERT_TRUE(session_->Register(&context, -1, Attempter()).ok());
    // Initial values i % 7, exact in float32 as are the updates below.
    for (int64_t i = 0; i < kValues; ++i) initial_.push_back(static_cast<float>(i % 7));
    v1::InitializeHeader header;
    *header.mutable_model() = model_;
    header.set_length(kValues);
    header.set_dtype(v1::FLOAT32);
    grpc::ClientContext init_context;
    v1::InitializeResponse response;
    ASSERT_TRUE(session_->paths().rpc->Initialize(header, initial_, &init_context, &response).ok());
  }

  ShardSession::Attempter Attempter() {
    return [](const std::function<AttemptEnd(grpc::ClientContext*)>& fn) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
      return fn(&context);
    };
  }

  // The path under test, and that the session chose it.
  TensorPath& Path() {
    ShardSession::Paths paths = session_->paths();
    switch (GetParam()) {
      case Kind::kSharedMemory:
        EXPECT_NE(paths.shared, nullptr);
        if (paths.shared != nullptr) return *paths.shared;
        break;
      case Kind::kDataPlane:
        EXPECT_NE(paths.data, nullptr);
        if (paths.data != nullptr) return *paths.data;
        break;
      case Kind::kGrpc:
        break;
    }
    return *paths.rpc;
  }

  PushPart Part(const std::vector<float>& gradient, int64_t sequence) {
    const ShardSession::State state = session_->state();
    PushPart part{{}, gradient, WireType::kFloat32};
    v1::PushHeader& h = part.header;
    h.set_worker_id(0);
    h.set_incarnation(state.incarnation);
    h.set_shard_incarnation(state.shard_incarnation);
    h.set_sequence(sequence);
    h.set_base_version(state.version);
    h.set_length(kValues);
    h.set_dtype(v1::FLOAT32);
    return part;
  }

  AttemptEnd Push(const PushPart& part, absl::Duration deadline = absl::Seconds(10)) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    PushDone done;
    return Path().Push(part, PathCall{&context, session_->paths().rpc}, &done);
  }

  // A pull of the shard's values into `values`.
  PullPart PullOf(std::vector<float>& values) {
    PullPart part{{}, absl::MakeSpan(values)};
    part.request.set_length(kValues);
    part.request.set_worker_id(0);
    part.request.set_shard_incarnation(session_->state().shard_incarnation);
    part.request.set_dtype(v1::FLOAT32);
    *part.request.mutable_model() = model_;
    return part;
  }

  // The shard's values, pulled on the path under test (or gRPC's, once that one may be gone).
  std::vector<float> Pulled(bool on_grpc = false) {
    std::vector<float> values(kValues, -1);
    PullPart part = PullOf(values);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::PullChunk answer;
    TensorPath& path = on_grpc ? *session_->paths().rpc : Path();
    AttemptEnd end = path.Pull(part, PathCall{&context, session_->paths().rpc}, &answer);
    EXPECT_TRUE(end.ok()) << end.status;
    EXPECT_EQ(answer.offset(), 0);
    return values;
  }

  std::vector<float> Gradient() const {
    std::vector<float> g(kValues);
    for (int64_t i = 0; i < kValues; ++i) g[i] = static_cast<float>((i % 5) - 2);
    return g;
  }
  std::vector<float> Applied(const std::vector<float>& g) const {
    std::vector<float> w = initial_;
    for (int64_t i = 0; i < kValues; ++i) w[i] -= kLr * g[i];
    return w;
  }

  std::unique_ptr<InProcessShard> shard_;
  v1::ModelIdentity model_;
  ClientOptions options_;
  CallThreads threads_;
  std::unique_ptr<ShardSession> session_;
  std::vector<float> initial_;
};

TEST_P(TensorPathTest, PushedAndPulledValuesAreExact) {
  EXPECT_EQ(Pulled(), initial_);
  const std::vector<float> g = Gradient();
  AttemptEnd end = Push(Part(g, 0));
  ASSERT_TRUE(end.ok()) << end.status;
  EXPECT_EQ(Pulled(), Applied(g));
}

TEST_P(TensorPathTest, APartStillBeingFilledGoesOnceItIsFinal) {
  const std::vector<float> g = Gradient();
  FillProgress filling(kValues);
  PushPart part = Part(g, 0);
  part.filling = &filling;
  // Filled in from the end in pieces, on another thread, while the push is under way.
  std::thread backward([&] {
    for (int64_t done = 0; done < kValues;) {
      const int64_t n = std::min<int64_t>(kFillPiece / 4, kValues - done);
      absl::SleepFor(absl::Microseconds(200));
      filling.Add(n);
      done += n;
    }
  });
  AttemptEnd end = Push(part);
  backward.join();
  ASSERT_TRUE(end.ok()) << end.status;
  EXPECT_EQ(Pulled(), Applied(g));
}

TEST_P(TensorPathTest, APartDroppedBeforeItWasFinalEndsDroppedHereAndChangesNothing) {
  FillProgress filling(kValues);
  PushPart part = Part(Gradient(), 0);
  part.filling = &filling;
  filling.Add(kValues / 2);
  std::thread drop([&] {
    absl::SleepFor(absl::Milliseconds(20));
    filling.Stop();
  });
  AttemptEnd end = Push(part);
  drop.join();
  EXPECT_EQ(end.kind, AttemptEnd::Kind::kDroppedHere) << end.status;
  EXPECT_EQ(end.status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(Pulled(/*on_grpc=*/true), initial_);
}

// A part waits for its values within the attempt's deadline, and fails at it, changing nothing;
// one sent as it is filled (the data plane's, last piece first) takes what backward takes
// instead, and arrives whole once backward made it.
TEST_P(TensorPathTest, APartNotFinalByTheDeadlineFailsUnlessItIsSentAsItIsFilled) {
  const std::vector<float> g = Gradient();
  FillProgress filling(kValues);
  PushPart part = Part(g, 0);
  part.filling = &filling;
  filling.Add(1);
  std::thread backward([&] {
    absl::SleepFor(absl::Milliseconds(600));
    filling.Add(kValues);
  });
  AttemptEnd end = Push(part, absl::Milliseconds(300));
  backward.join();
  if (Path().SendsAsFilled(kValues)) {
    ASSERT_TRUE(end.ok()) << end.status;
    EXPECT_EQ(Pulled(), Applied(g));
  } else {
    EXPECT_EQ(end.status.code(), absl::StatusCode::kDeadlineExceeded) << end.status;
    EXPECT_EQ(Pulled(), initial_);
  }
}

TEST_P(TensorPathTest, APushForAnotherShardProcessIsToldItRestarted) {
  PushPart part = Part(Gradient(), 0);
  part.header.set_shard_incarnation(part.header.shard_incarnation() + 1);
  AttemptEnd end = Push(part);
  EXPECT_EQ(end.kind, AttemptEnd::Kind::kShardRestarted) << end.status;
  EXPECT_EQ(Pulled(), initial_);
}

TEST_P(TensorPathTest, BadInputIsRefusedAndChangesNothing) {
  std::vector<float> g = Gradient();
  g[kValues / 3] = std::nanf("");
  AttemptEnd end = Push(Part(g, 0));
  EXPECT_EQ(end.status.code(), absl::StatusCode::kInvalidArgument) << end.status;
  PushPart wrong = Part(Gradient(), 1);
  wrong.header.set_offset(1);  // a range the shard does not hold
  end = Push(wrong);
  EXPECT_FALSE(end.ok());
  EXPECT_NE(end.kind, AttemptEnd::Kind::kNotTaken);
  EXPECT_EQ(Pulled(), initial_);
}

TEST_P(TensorPathTest, ACutConnectionFailsTheAttemptWithinItsDeadline) {
  TensorPath& path = Path();
  ASSERT_TRUE(shard_->Stop().ok());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  PushDone done;
  const absl::Time start = absl::Now();
  AttemptEnd end = path.Push(Part(Gradient(), 0), PathCall{&context, session_->paths().rpc}, &done);
  EXPECT_FALSE(end.ok());
  EXPECT_NE(end.kind, AttemptEnd::Kind::kNotTaken);
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
  if (GetParam() == Kind::kDataPlane) {
    EXPECT_EQ(end.kind, AttemptEnd::Kind::kPathLost) << end.status;
  }
}

// Compression around the path: a push part is compressed once (its bytes kept in the push's slot
// and resent as they are) and goes where the path carries bytes; a pull's change travels over
// gRPC. top-k of every value is exact: the shard applies the gradient as sent uncompressed.
TEST_P(TensorPathTest, CompressionWrapsThePathAndAPartIsCompressedOnce) {
  const Compression every_value{Compressor::kTopK, 1.0};
  CompressedPath::Compression compression;
  compression.pushes = std::make_unique<PushCompressor>(every_value, /*error_feedback=*/true,
                                                        std::vector<int64_t>{kValues});
  compression.pulls = std::make_unique<CompressedPulls>(every_value);
  GrpcPath* const rpc = session_->paths().rpc;
  CompressedPath compressed(Path(), compression), over_grpc(*rpc, compression);
  EXPECT_FALSE(compressed.SendsAsFilled(kValues));
  const std::vector<float> g = Gradient();
  PushPart part = Part(g, 0);
  std::shared_ptr<const CompressedTensor> bytes;
  part.compressed_once = &bytes;
  auto push = [&](CompressedPath& path) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    PushDone done;
    return path.Push(part, PathCall{&context, rpc}, &done);
  };
  AttemptEnd end = push(compressed);
  ASSERT_NE(bytes, nullptr);
  const CompressedTensor* made = bytes.get();
  if (GetParam() != Kind::kGrpc) {
    // The data plane carries values only; top-k's pairs take twice the values' bytes, more than
    // a shared region holds: both pass the part on, for gRPC to carry.
    EXPECT_EQ(end.kind, AttemptEnd::Kind::kNotTaken) << end.status;
    end = push(over_grpc);
  }
  ASSERT_TRUE(end.ok()) << end.status;
  EXPECT_EQ(bytes.get(), made) << "compressed again";
  EXPECT_EQ(compression.pushes->Residual(0), std::vector<float>(kValues, 0.0f));
  EXPECT_EQ(Pulled(/*on_grpc=*/true), Applied(g));

  std::vector<float> values(kValues, -1);
  PullPart pull = PullOf(values);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::PullChunk answer;
  AttemptEnd pulled = compressed.Pull(pull, PathCall{&context, rpc}, &answer);
  if (GetParam() == Kind::kGrpc) {
    ASSERT_TRUE(pulled.ok()) << pulled.status;
    EXPECT_NE(answer.view(), 0u);
    EXPECT_EQ(values, Applied(g));
  } else {
    EXPECT_EQ(pulled.kind, AttemptEnd::Kind::kNotTaken) << pulled.status;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryPath, TensorPathTest,
                         testing::Values(Kind::kGrpc, Kind::kSharedMemory, Kind::kDataPlane),
                         KindName);

}  // namespace
}  // namespace ps
