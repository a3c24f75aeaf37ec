// Model files: the model's own tensor names and shapes over the flat layout, the orientation the
// forward pass uses, and clear refusals of other models, shapes and files.
#include "trainer/model_file.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include "common/model_spec.h"
#include "common/safetensors.h"
#include "tests/run_dir.h"
#include "trainer/network.h"

namespace ps {
namespace {

std::vector<float> RandomParams(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> p(n);
  for (float& v : p) v = normal(rng);
  return p;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

const char kModel[] = "mlp:4-3-2";
constexpr int64_t kParams = 4 * 3 + 3 + 3 * 2 + 2;

TEST(ModelFileTest, HoldsTheFlatVectorUnderTheModelsTensorNamesAndShapes) {
  const std::string path = NewRunDir("model_file") + "/model.safetensors";
  const std::vector<float> params = RandomParams(kParams, 1);
  ASSERT_TRUE(WriteModelFile(path, {kModel, {7, 9}, params}).ok());

  absl::StatusOr<Safetensors> raw = ReadSafetensors(path);
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(raw->metadata.at("format"), "ps.model.v1");
  EXPECT_EQ(raw->metadata.at("model"), kModel);
  EXPECT_EQ(raw->metadata.at("versions"), "[7,9]");
  const std::map<std::string, std::vector<int64_t>> shapes = {
      {"fc1.weight", {4, 3}}, {"fc1.bias", {3}}, {"fc2.weight", {3, 2}}, {"fc2.bias", {2}}};
  ASSERT_EQ(raw->tensors.size(), shapes.size());
  for (const TensorSlot& slot : TensorSlots(MlpNetwork({4, 3, 2}))) {
    const Safetensors::Tensor& t = raw->tensors.at(slot.name);
    EXPECT_EQ(t.shape, shapes.at(slot.name)) << slot.name;
    EXPECT_EQ(t.data, std::vector<float>(params.begin() + slot.offset,
                                         params.begin() + slot.offset + slot.size))
        << slot.name;
  }
  // In file order, the tensors are the flat vector: the data section is its bytes.
  const std::string bytes = ReadBytes(path);
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  ASSERT_EQ(bytes.size(), 8 + header + kParams * sizeof(float));
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + header, params.data(), kParams * sizeof(float)), 0);

  absl::StatusOr<ModelFile> read = ReadModelFile(path, kModel);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->model, kModel);
  EXPECT_EQ(read->versions, (std::vector<int64_t>{7, 9}));
  EXPECT_EQ(read->params, params);
}

// fc<l>.weight [in, out] is what the forward pass multiplies by: y = x W + b, row vector x. The
// loss computed from the file's tensors, indexed that way, is the Mlp's.
TEST(ModelFileTest, WeightsAreInByOutAsTheForwardPassUsesThem) {
  const std::string path = NewRunDir("model_file") + "/model.safetensors";
  const std::vector<float> params = RandomParams(kParams, 2);
  ASSERT_TRUE(WriteModelFile(path, {kModel, {1}, params}).ok());
  absl::StatusOr<Safetensors> file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const std::vector<float> inputs = RandomParams(5 * 4, 3);
  const std::vector<int32_t> labels = {0, 1, 1, 0, 1};

  double loss = 0;
  for (int r = 0; r < 5; ++r) {
    std::vector<double> x(inputs.begin() + r * 4, inputs.begin() + (r + 1) * 4);
    for (int l = 1; l <= 2; ++l) {
      const Safetensors::Tensor& w = file->tensors.at("fc" + std::to_string(l) + ".weight");
      const Safetensors::Tensor& b = file->tensors.at("fc" + std::to_string(l) + ".bias");
      const int64_t in = w.shape[0], out = w.shape[1];
      std::vector<double> y(out);
      for (int64_t j = 0; j < out; ++j) {
        y[j] = b.data[j];
        for (int64_t i = 0; i < in; ++i) y[j] += x[i] * w.data[i * out + j];
        if (l < 2) y[j] = std::max(y[j], 0.0);
      }
      x = y;
    }
    loss += std::log(std::exp(x[0]) + std::exp(x[1])) - x[labels[r]];
  }
  auto backend = MakeCpuBackend(1);
  Network mlp(MlpNetwork({4, 3, 2}), 8, backend.get());
  EXPECT_NEAR(mlp.Evaluate(params, inputs.data(), labels.data(), 5).loss, loss / 5, 1e-5);
}

TEST(ModelFileTest, RefusesAnotherModelAMissingExtraOrMisshapenTensorAndOtherFiles) {
  const std::string dir = NewRunDir("model_file");
  const std::string good = dir + "/model.safetensors";
  const std::vector<float> params = RandomParams(kParams, 4);
  ASSERT_TRUE(WriteModelFile(good, {kModel, {5}, params}).ok());
  auto refusal = [](const absl::StatusOr<ModelFile>& read, absl::StatusCode code,
                    const std::string& says) {
    EXPECT_EQ(read.status().code(), code) << read.status();
    EXPECT_NE(read.status().message().find(says), std::string::npos) << read.status();
  };
  refusal(ReadModelFile(good, "mlp:4-5-2"), absl::StatusCode::kInvalidArgument,
          "holds model mlp:4-3-2, expected mlp:4-5-2");
  refusal(ReadModelFile(good, "flat:21"), absl::StatusCode::kInvalidArgument,
          "holds model mlp:4-3-2, expected flat:21");
  refusal(ReadModelFile(dir + "/missing.safetensors", kModel), absl::StatusCode::kNotFound,
          "cannot open");

  // Hand-made files: the right metadata around wrong tensors, and a shard checkpoint.
  const std::map<std::string, std::string> metadata = {
      {"format", "ps.model.v1"}, {"model", kModel}, {"versions", "[5]"}};
  auto view = [&](int64_t offset, int64_t size) {
    return absl::MakeConstSpan(params).subspan(offset, size);
  };
  std::vector<TensorView> tensors = {{"fc1.weight", {4, 3}, view(0, 12)},
                                     {"fc1.bias", {3}, view(12, 3)},
                                     {"fc2.weight", {3, 2}, view(15, 6)},
                                     {"fc2.bias", {2}, view(21, 2)}};
  const std::string bad = dir + "/bad.safetensors";
  std::vector<TensorView> transposed = tensors;
  transposed[0].shape = {3, 4};  // PyTorch's [out, in]
  ASSERT_TRUE(WriteSafetensors(bad, transposed, metadata).ok());
  refusal(ReadModelFile(bad, kModel), absl::StatusCode::kInvalidArgument,
          "fc1.weight has shape [3,4], expected [4,3]");
  ASSERT_TRUE(WriteSafetensors(bad, {tensors[0], tensors[1], tensors[2]}, metadata).ok());
  refusal(ReadModelFile(bad, kModel), absl::StatusCode::kInvalidArgument, "no tensor fc2.bias");
  std::vector<TensorView> extra = tensors;
  extra.push_back({"fc3.bias", {2}, view(21, 2)});
  ASSERT_TRUE(WriteSafetensors(bad, extra, metadata).ok());
  refusal(ReadModelFile(bad, kModel), absl::StatusCode::kInvalidArgument,
          "has a tensor fc3.bias that mlp:4-3-2 does not");
  ASSERT_TRUE(WriteSafetensors(bad, tensors,
                               {{"format", "ps.model.v1"}, {"model", kModel}, {"versions", "7"}})
                  .ok());
  refusal(ReadModelFile(bad, kModel), absl::StatusCode::kInvalidArgument, "versions");
  ASSERT_TRUE(WriteSafetensors(bad, {{"values", {kParams}, params}},
                               {{"format", "ps.shard.v1"}, {"model", kModel}})
                  .ok());
  refusal(ReadModelFile(bad, kModel), absl::StatusCode::kInvalidArgument,
          "not a model file (format 'ps.shard.v1'");

  // A flipped bit is corruption.
  std::string bytes = ReadBytes(good);
  bytes.back() ^= 1;
  std::ofstream(good, std::ios::binary | std::ios::trunc) << bytes;
  refusal(ReadModelFile(good, kModel), absl::StatusCode::kDataLoss, "checksum mismatch");
}

TEST(ModelFileTest, WritingRefusesAWrongSizeNoVersionsAndNoModel) {
  const std::string path = NewRunDir("model_file") + "/model.safetensors";
  EXPECT_EQ(WriteModelFile(path, {kModel, {1}, std::vector<float>(kParams - 1)}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteModelFile(path, {kModel, {}, std::vector<float>(kParams)}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteModelFile(path, {"rnn:3", {1}, std::vector<float>(21)}).code(),
            absl::StatusCode::kInvalidArgument);
}

// A tensor layout's file holds the layout's own names and shapes (a PyTorch module's: [out, in]
// weights), in flat order, and names the model by its fingerprint.
TEST(ModelFileTest, ALayoutsFileHoldsItsOwnNamesAndShapes) {
  const std::string path = NewRunDir("model_file") + "/layout.safetensors";
  const std::string layout = R"({"tensors": [{"name": "fc.weight", "shape": [2, 3]},
                                             {"name": "fc.bias", "shape": [2]}]})";
  const std::vector<float> values = RandomParams(8, 5);
  ASSERT_TRUE(WriteModelFile(path, {layout, {7}, values}).ok());
  absl::StatusOr<Safetensors> raw = ReadSafetensors(path);
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(raw->metadata["model"], ParseModelSpec(layout, 1)->fingerprint);
  EXPECT_EQ(raw->tensors["fc.weight"].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(raw->tensors["fc.weight"].data, std::vector<float>(values.begin(), values.begin() + 6));
  EXPECT_EQ(raw->tensors["fc.bias"].data, std::vector<float>(values.begin() + 6, values.end()));
  absl::StatusOr<ModelFile> read = ReadModelFile(path, layout);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->params, values);
  const std::string renamed = R"({"tensors": [{"name": "fc.weight", "shape": [2, 3]},
                                              {"name": "fc.b", "shape": [2]}]})";
  EXPECT_NE(ReadModelFile(path, renamed).status().message().find("holds model layout:8:"),
            std::string::npos);
  const std::string flat = NewRunDir("model_file") + "/flat.safetensors";
  ASSERT_TRUE(WriteModelFile(flat, {"flat:8", {7}, values}).ok());
  EXPECT_EQ(ReadModelFile(flat, "flat:8")->params, values);
}

// A CNN's file holds its convolutions as [K, K, C_in, C_out] and reads back bit-identical.
TEST(ModelFileTest, ACnnRoundTrips) {
  const std::string path = NewRunDir("model_file") + "/cnn.safetensors";
  const std::string model = "cnn:1x8x8-conv4k3-pool2-fc6-10";
  const int64_t params = ParseNetworkSpec(model)->num_params();
  const std::vector<float> values = RandomParams(params, 9);
  ASSERT_TRUE(WriteModelFile(path, {model, {3, 4}, values}).ok());
  absl::StatusOr<ModelFile> read = ReadModelFile(path, model);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->params, values);
  EXPECT_EQ(read->versions, (std::vector<int64_t>{3, 4}));
  absl::StatusOr<ModelFile> other = ReadModelFile(path, "cnn:1x8x8-conv4k5-pool2-fc6-10");
  EXPECT_FALSE(other.ok());
}

}  // namespace
}  // namespace ps
