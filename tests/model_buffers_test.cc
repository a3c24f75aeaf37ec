// A layout's buffers (BatchNorm's running statistics, say): named tensors after the parameters
// that the shards hold and export but do not train. A push carries their values, which replace
// the shard's (under sync, the round's average does); clipping and the norm guard see only the
// trained values.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/model_spec.h"
#include "common/tensor_layout.h"
#include "server/state/parameter_shard.h"

namespace ps {
namespace {

// Three trained values, then a buffer of two and a scalar buffer.
const std::string kLayout =
    R"({"tensors": [{"name": "fc.weight", "shape": [3]},
                    {"name": "bn.running_mean", "shape": [2], "buffer": true},
                    {"name": "bn.num_batches_tracked", "shape": [], "buffer": true}]})";

TEST(LayoutBuffersTest, ParsedCountedAndWrittenOnlyWhereSet) {
  absl::StatusOr<TensorLayout> layout = ParseTensorLayout(kLayout);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_FALSE(layout->tensors[0].buffer);
  EXPECT_TRUE(layout->tensors[1].buffer);
  EXPECT_EQ(layout->num_params(), 6);
  EXPECT_EQ(layout->num_buffer_values(), 3);
  EXPECT_EQ(layout->ToJson(), R"({"tensors":[{"name":"fc.weight","shape":[3]},)"
                              R"({"buffer":true,"name":"bn.running_mean","shape":[2]},)"
                              R"({"buffer":true,"name":"bn.num_batches_tracked","shape":[]}]})");
  // A layout of parameters only keeps the text (and so the fingerprint) it had before buffers.
  EXPECT_EQ(ParseTensorLayout(R"({"tensors": [{"name": "w", "shape": [2]}]})")->ToJson(),
            R"({"tensors":[{"name":"w","shape":[2]}]})");
  absl::StatusOr<ModelIdentity> id = ParseModelSpec(kLayout, 2);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(id->buffer_values, 3);
}

TEST(LayoutBuffersTest, AParameterAfterABufferOrANonBooleanFlagIsRefused) {
  absl::StatusOr<TensorLayout> after = ParseTensorLayout(
      R"({"tensors": [{"name": "bn.running_var", "shape": [2], "buffer": true},
                      {"name": "fc.weight", "shape": [3]}]})");
  EXPECT_EQ(after.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(after.status().message().find(
                "parameter fc.weight comes after buffer bn.running_var; buffers come after all "
                "parameters"),
            std::string::npos)
      << after.status();
  absl::StatusOr<TensorLayout> flag =
      ParseTensorLayout(R"({"tensors": [{"name": "w", "shape": [2], "buffer": 1}]})");
  EXPECT_NE(flag.status().message().find("w: \"buffer\" is true or false"), std::string::npos)
      << flag.status();
}

// One shard of kLayout, SGD at rate 1, initialised to 1..6, with `workers` registered.
struct BufferShard {
  BufferShard(const std::string& consistency, int workers, float clip_norm = 0) {
    ShardConfig c;
    c.model = kLayout;
    c.num_workers = workers;
    c.optimizer.name = "sgd";
    c.learning_rate.base = 1.0f;
    c.consistency = consistency;
    c.clip_norm = clip_norm;
    shard = *ParameterShard::Create(c);
    EXPECT_TRUE(shard->Initialize(model, 0, {1, 2, 3, 4, 5, 6}).ok());
    for (int w = 0; w < workers; ++w) EXPECT_TRUE(shard->Register(w, model).ok());
  }
  absl::StatusOr<PushOutcome> Push(int worker, int64_t sequence, std::vector<float> g) {
    int64_t incarnation = 0;
    for (const WorkerSnapshot& w : shard->Stats().workers) {
      if (w.worker_id == worker) incarnation = w.incarnation;
    }
    return shard->Push({worker, sequence, shard->Stats().version, 0, 6, incarnation}, g);
  }
  std::vector<float> Weights() {
    ParameterShard::Snapshot s = *shard->Read(model, -1, 0, 0, absl::InfiniteFuture());
    return std::vector<float>(s.values.span().begin(), s.values.span().end());
  }
  ModelIdentity model = *ParseModelSpec(kLayout, 1);
  std::unique_ptr<ParameterShard> shard;
};

TEST(ShardBuffersTest, APushTrainsTheParametersAndSetsTheBuffers) {
  BufferShard s("async", 1);
  ASSERT_TRUE(s.Push(0, 0, {1, 1, 1, 0.5f, -2, 7}).ok());
  EXPECT_EQ(s.Weights(), (std::vector<float>{0, 1, 2, 0.5f, -2, 7}));
  ASSERT_TRUE(s.Push(0, 1, {0, 0, 0, 0.25f, -1, 8}).ok());
  EXPECT_EQ(s.Weights(), (std::vector<float>{0, 1, 2, 0.25f, -1, 8}));
}

TEST(ShardBuffersTest, ClippingSeesAndScalesOnlyTheTrainedValues) {
  BufferShard s("async", 1, /*clip_norm=*/1.0f);
  // The trained values' norm is 5 (scaled by 1/5); the buffers' values are far larger and stay.
  ASSERT_TRUE(s.Push(0, 0, {3, 0, 4, 100, 200, 300}).ok());
  EXPECT_EQ(s.Weights(), (std::vector<float>{1 - 0.6f, 2, 3 - 0.8f, 100, 200, 300}));
  // Trained values of norm 0.5 with large buffers: not clipped.
  ASSERT_TRUE(s.Push(0, 1, {0.5f, 0, 0, 100, 200, 301}).ok());
  EXPECT_EQ(s.Weights(), (std::vector<float>{1 - 0.6f - 0.5f, 2, 3 - 0.8f, 100, 200, 301}));
  EXPECT_EQ(s.shard->Stats().pushes_clipped, 1);
}

TEST(ShardBuffersTest, ASyncRoundAveragesTheBuffers) {
  BufferShard s("sync", 2);
  ASSERT_TRUE(s.Push(0, 0, {2, 2, 2, 1, 10, 4}).ok());
  ASSERT_TRUE(s.Push(1, 0, {0, 2, 4, 3, 20, 4}).ok());
  EXPECT_EQ(s.Weights(), (std::vector<float>{0, 0, 0, 2, 15, 4}));
}

// Two shards over the six values: shard 1 owns [3, 6), buffers only, and sets them.
TEST(ShardBuffersTest, AShardOfBuffersOnlySetsThem) {
  ShardConfig c;
  c.model = kLayout;
  c.shard_index = 1;
  c.num_shards = 2;
  c.num_workers = 1;
  c.optimizer.name = "adam";
  c.learning_rate.base = 0.1f;
  std::unique_ptr<ParameterShard> shard = *ParameterShard::Create(c);
  const ModelIdentity model = *ParseModelSpec(kLayout, 2);
  ASSERT_TRUE(shard->Initialize(model, 3, {4, 5, 6}).ok());
  ASSERT_TRUE(shard->Register(0, model).ok());
  const int64_t incarnation = shard->Stats().workers.at(0).incarnation;
  ASSERT_TRUE(shard->Push({0, 0, 0, 3, 3, incarnation}, {7, 8, 9}).ok());
  ParameterShard::Snapshot after = *shard->Read(model, -1, 0, 0, absl::InfiniteFuture());
  EXPECT_EQ(std::vector<float>(after.values.span().begin(), after.values.span().end()),
            (std::vector<float>{7, 8, 9}));
}

}  // namespace
}  // namespace ps
