// Compressed pulls: the shard's views of what each worker holds (PullViews, its arithmetic by
// hand), and a worker's compressed pulls from a shard served over gRPC on 127.0.0.1.
#include "server/rpc/pull_views.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/partition.h"
#include "proto/ps.grpc.pb.h"
#include "tests/in_process_shard.h"
#include "client/sharded_client.h"

namespace ps {
namespace {

const Compression kInt8{Compressor::kInt8, 0};

// A worker's side of the views: applies answers as ShardedClient does.
struct Holder {
  uint64_t view = 0;
  std::vector<float> values;

  // Applies `a`, an answer to a pull of `whole` sent as `type` when it is whole.
  void Take(const PullViews::Answer& a, const std::vector<float>& whole, WireType type) {
    if (a.base == 0) {
      std::string wire;
      EncodeValues(whole, type, &wire);
      values.resize(whole.size());
      DecodeValues(wire, type, absl::MakeSpan(values));
    } else {
      ASSERT_EQ(a.base, view);
      std::vector<float> change(values.size());
      CompressedDecoder decoder(a.change.compressor, a.change.pairs, absl::MakeSpan(change));
      ASSERT_TRUE(decoder.Append(a.change.bytes).ok());
      ASSERT_TRUE(decoder.Finish().ok());
      for (size_t i = 0; i < values.size(); ++i) values[i] += change[i];
    }
    view = a.view;
  }
};

TEST(PullViewsTest, AChangeGoesCompressedAndWhatItLeftOutGoesWithTheNextPull) {
  PullViews views(4, 8);
  Holder worker;
  // The first pull is whole (the worker names no view) and exact as float32.
  std::vector<float> w = {0, 0, 0, 0};
  PullViews::Answer a = views.Encode(0, worker.view, w, WireType::kFloat32, kInt8);
  EXPECT_EQ(a.base, 0u);
  EXPECT_NE(a.view, 0u);
  worker.Take(a, w, WireType::kFloat32);
  EXPECT_EQ(worker.values, w);

  // The weights move by [127, -63.375, 0.5, 10.25]: int8's scale is 127 / 127 = 1 and q rounds
  // to nearest (0.5 ties to even, 0), so the worker gets [127, -63, 0, 10] and
  // [0, -0.375, 0.5, 0.25] is left out.
  w = {127, -63.375f, 0.5f, 10.25f};
  a = views.Encode(0, worker.view, w, WireType::kFloat32, kInt8);
  EXPECT_NE(a.base, 0u);
  EXPECT_EQ(a.change.compressor, Compressor::kInt8);
  worker.Take(a, w, WireType::kFloat32);
  EXPECT_EQ(worker.values, (std::vector<float>{127, -63, 0, 10}));

  // Unchanged weights: the next pull sends what was left out, scale 0.5 / 127, q = [0, -95, 127,
  // 64] (-95.25 and 63.5 rounded).
  a = views.Encode(0, worker.view, w, WireType::kFloat32, kInt8);
  ASSERT_NE(a.base, 0u);
  worker.Take(a, w, WireType::kFloat32);
  const float scale = 0.5f / 127;
  EXPECT_FLOAT_EQ(worker.values[0], 127);
  EXPECT_FLOAT_EQ(worker.values[1], -63 + -95 * scale);
  EXPECT_FLOAT_EQ(worker.values[2], 127 * scale);
  EXPECT_FLOAT_EQ(worker.values[3], 10 + 64 * scale);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(worker.values[i], w[i], scale / 2 + 1e-6) << i;
}

TEST(PullViewsTest, AViewNamedWronglyGetsTheWholeValuesAndEachWorkerHasItsOwn) {
  PullViews views(300, 8);
  std::vector<float> w(300);
  for (int i = 0; i < 300; ++i) w[i] = std::sin(i * 0.1f);
  Holder a, b;
  a.Take(views.Encode(0, a.view, w, WireType::kFloat32, kInt8), w, WireType::kFloat32);
  b.Take(views.Encode(1, b.view, w, WireType::kFloat32, kInt8), w, WireType::kFloat32);
  EXPECT_EQ(views.size(), 2);
  for (float& x : w) x += 0.25f;
  // Worker 0 names its view: a change. Naming worker 1's, an old one, or none: whole values.
  EXPECT_NE(views.Encode(0, a.view, w, WireType::kFloat32, kInt8).base, 0u);
  EXPECT_EQ(views.Encode(0, b.view, w, WireType::kFloat32, kInt8).base, 0u);
  EXPECT_EQ(views.Encode(0, a.view, w, WireType::kFloat32, kInt8).base, 0u) << "used up";
  EXPECT_EQ(views.Encode(0, 0, w, WireType::kFloat32, kInt8).base, 0u);
  // Worker 1's view was not touched by any of that.
  PullViews::Answer answer = views.Encode(1, b.view, w, WireType::kFloat32, kInt8);
  ASSERT_NE(answer.base, 0u);
  b.Take(answer, w, WireType::kFloat32);
  for (int i = 0; i < 300; ++i) EXPECT_NEAR(b.values[i], w[i], 0.25f / 127) << i;
}

TEST(PullViewsTest, WholeValuesAsBf16StartAViewOfWhatTheWorkerDecodes) {
  PullViews views(256, 1);
  std::vector<float> w(256, 1.00390625f);  // 1 + 2^-8: bf16 rounds it to 1 (ties to even)
  Holder worker;
  worker.Take(views.Encode(0, 0, w, WireType::kBFloat16, kInt8), w, WireType::kBFloat16);
  EXPECT_EQ(worker.values[0], 1.0f);
  // The rounding is a change like any other: the next pull sends it (exactly, here).
  worker.Take(views.Encode(0, worker.view, w, WireType::kBFloat16, kInt8), w,
              WireType::kBFloat16);
  EXPECT_EQ(worker.values, w);
}

TEST(PullViewsTest, TheLeastRecentViewIsDroppedBeyondTheLimitAndNoneKeptAtZero) {
  PullViews views(16, 2);
  std::vector<float> w(16, 1);
  Holder h[3];
  for (int k = 0; k < 3; ++k) {
    h[k].Take(views.Encode(k, 0, w, WireType::kFloat32, kInt8), w, WireType::kFloat32);
  }
  EXPECT_EQ(views.size(), 2);
  EXPECT_EQ(views.Encode(0, h[0].view, w, WireType::kFloat32, kInt8).base, 0u) << "dropped";
  EXPECT_NE(views.Encode(2, h[2].view, w, WireType::kFloat32, kInt8).base, 0u);
  views.Forget(2);  // it left
  EXPECT_EQ(views.size(), 1);

  PullViews none(16, 0);
  PullViews::Answer a = none.Encode(0, 0, w, WireType::kFloat32, kInt8);
  EXPECT_EQ(a.base, 0u);
  EXPECT_EQ(a.view, 0u);
  EXPECT_EQ(none.size(), 0);
}

// A worker pulling int8-compressed from two shards over gRPC, its weights moved by its own SGD
// pushes in between: the first pull is exact, each later one within int8's rounding of the
// change, and unchanged weights come closer with every pull (what was left out arrives).
TEST(CompressedPullTest, AWorkerFollowsTheWeightsWithinInt8sRounding) {
  constexpr int64_t kParams = 10000;
  std::vector<std::unique_ptr<InProcessShard>> shards;
  std::vector<std::string> addresses;
  for (int s = 0; s < 2; ++s) {
    ShardServerConfig config = ShardOf("flat:10000", 1, s, 2);
    config.shard.optimizer.name = "sgd";
    config.shard.learning_rate.base = 1;
    absl::StatusOr<std::unique_ptr<InProcessShard>> shard = InProcessShard::Start(config);
    ASSERT_TRUE(shard.ok()) << shard.status();
    addresses.push_back((*shard)->address());
    shards.push_back(*std::move(shard));
  }
  const ModelIdentity model{"flat:10000", kParams, 2};
  ClientOptions options;
  options.pull_compression = kInt8;
  ShardedClient worker(addresses, model, 0, options);
  ASSERT_TRUE(worker.Register().ok());
  std::vector<float> w(kParams);
  for (int64_t i = 0; i < kParams; ++i) w[i] = std::cos(i * 0.01f);
  ASSERT_TRUE(worker.Initialize(w).ok());

  std::vector<float> pulled(kParams, -7);
  ASSERT_TRUE(worker.Pull(absl::MakeSpan(pulled)).ok());
  EXPECT_EQ(pulled, w) << "the first pull is whole";

  std::vector<float> g(kParams);
  for (int64_t i = 0; i < kParams; ++i) g[i] = 0.01f * std::sin(i * 0.37f);
  ASSERT_TRUE(worker.Push(g).ok());
  for (int64_t i = 0; i < kParams; ++i) w[i] -= g[i];  // lr 1
  ASSERT_TRUE(worker.Pull(absl::MakeSpan(pulled)).ok());
  // int8 rounds each value of a block to within half its scale (max |change| / 127).
  double error = 0;
  for (int64_t i = 0; i < kParams; ++i) {
    ASSERT_NEAR(pulled[i], w[i], 0.01 / 127 / 2 + 1e-6) << i;
    error = std::max<double>(error, std::fabs(pulled[i] - w[i]));
  }
  EXPECT_GT(error, 0) << "int8 lost something of this change";
  ASSERT_TRUE(worker.Pull(absl::MakeSpan(pulled)).ok());
  double closer = 0;
  for (int64_t i = 0; i < kParams; ++i) {
    closer = std::max<double>(closer, std::fabs(pulled[i] - w[i]));
  }
  EXPECT_LT(closer, error / 50) << "what int8 left out came with the next pull";

  absl::StatusOr<std::vector<v1::StatsResponse>> stats = worker.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  for (const v1::StatsResponse& s : *stats) {
    EXPECT_EQ(s.compressed_pulls(), 2);
    EXPECT_EQ(s.pull_views(), 1);
  }
}

// What a shard refuses in a compressed pull, before any value moves: an observer's (no view is
// kept for it), a compressor that is not one, a top-k fraction outside (0, 1].
TEST(CompressedPullTest, TheShardRefusesMalformedCompressedPulls) {
  absl::StatusOr<std::unique_ptr<InProcessShard>> shard =
      InProcessShard::Start(ShardOf("flat:1000", 1));
  ASSERT_TRUE(shard.ok()) << shard.status();
  ShardedClient init({(*shard)->address()}, {"flat:1000", 1000, 1}, 0);
  ASSERT_TRUE(init.Register().ok());
  ASSERT_TRUE(init.Initialize(std::vector<float>(1000, 1)).ok());
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel((*shard)->address(), grpc::InsecureChannelCredentials()));
  auto pull = [&](int worker, v1::DType compress, double fraction) {
    v1::PullRequest r;
    r.set_worker_id(worker);
    r.mutable_model()->set_fingerprint("flat:1000");
    r.mutable_model()->set_total_params(1000);
    r.mutable_model()->set_num_shards(1);
    r.set_length(1000);
    r.set_compress(compress);
    r.set_topk_fraction(fraction);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto reader = stub->Pull(&context, r);
    v1::PullChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish();
  };
  for (auto [worker, compress, fraction, why] :
       {std::tuple{-1, v1::INT8, 0.0, "an observer"}, {0, v1::BFLOAT16, 0.0, "not ONEBIT"},
        {0, v1::TOPK, 0.0, "topk_fraction 0"}, {0, v1::TOPK, 1.5, "topk_fraction 1.5"}}) {
    grpc::Status s = pull(worker, compress, fraction);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << why;
    EXPECT_NE(s.error_message().find(why), std::string::npos) << s.error_message();
  }
  grpc::Status ok = pull(0, v1::TOPK, 0.5);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
}

}  // namespace
}  // namespace ps
