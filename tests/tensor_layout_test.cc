// Tensor layouts: a model as named tensors (a PyTorch module's), parsed from inline JSON or a
// file, laid back to back in the flat vector, fingerprinted so that any difference in a name, a
// shape or the order is a different model, and refused with the problem named.
#include "common/tensor_layout.h"

#include <gtest/gtest.h>

#include <fstream>

#include "common/model_spec.h"
#include "tests/run_dir.h"

namespace ps {
namespace {

const char kLayout[] = R"({"tensors": [{"name": "conv1.weight", "shape": [16, 1, 5, 5]},
                                      {"name": "conv1.bias", "shape": [16]},
                                      {"shape": [], "name": "scale"}]})";

TEST(TensorLayoutTest, TensorsLieBackToBackInTheOrderListed) {
  absl::StatusOr<TensorLayout> layout = ParseTensorLayout(kLayout);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->tensors.size(), 3u);
  EXPECT_EQ(layout->tensors[0].name, "conv1.weight");
  EXPECT_EQ(layout->tensors[0].shape, (std::vector<int64_t>{16, 1, 5, 5}));
  EXPECT_EQ(layout->tensors[0].offset, 0);
  EXPECT_EQ(layout->tensors[0].size, 400);
  EXPECT_EQ(layout->tensors[1].offset, 400);
  EXPECT_EQ(layout->tensors[2].offset, 416);
  EXPECT_EQ(layout->tensors[2].size, 1) << "a scalar is one value";
  EXPECT_EQ(layout->num_params(), 417);
}

TEST(TensorLayoutTest, EqualLayoutsShareTheirTextAndFingerprintAndAnyDifferenceShows) {
  const TensorLayout layout = *ParseTensorLayout(kLayout);
  const std::string canonical = layout.ToJson();
  EXPECT_EQ(canonical,
            R"({"tensors":[{"name":"conv1.weight","shape":[16,1,5,5]},)"
            R"({"name":"conv1.bias","shape":[16]},{"name":"scale","shape":[]}]})");
  EXPECT_EQ(ParseTensorLayout(canonical)->ToJson(), canonical);
  EXPECT_EQ(ParseTensorLayout(canonical)->Fingerprint(), layout.Fingerprint());
  EXPECT_EQ(layout.Fingerprint().rfind("layout:417:", 0), 0u) << layout.Fingerprint();
  EXPECT_EQ(layout.Fingerprint().size(), std::string("layout:417:").size() + 16);
  for (const char* other : {
           R"({"tensors": [{"name": "conv1.weight", "shape": [16, 1, 5, 5]},
                           {"name": "conv1.bias", "shape": [16]}, {"name": "gain", "shape": []}]})",
           R"({"tensors": [{"name": "conv1.weight", "shape": [16, 5, 5, 1]},
                           {"name": "conv1.bias", "shape": [16]}, {"name": "scale", "shape": []}]})",
           R"({"tensors": [{"name": "conv1.bias", "shape": [16]},
                           {"name": "conv1.weight", "shape": [16, 1, 5, 5]},
                           {"name": "scale", "shape": []}]})"}) {
    EXPECT_NE(ParseTensorLayout(other)->Fingerprint(), layout.Fingerprint()) << other;
  }
}

TEST(TensorLayoutTest, TheFirstTensorThatDiffersIsNamedWithBothShapes) {
  const TensorLayout layout = *ParseTensorLayout(kLayout);
  EXPECT_EQ(LayoutDifference(layout, "a", *ParseTensorLayout(layout.ToJson()), "b"), "");
  auto difference = [&](const char* other) {
    return LayoutDifference(layout, "the shards' model", *ParseTensorLayout(other), "this one");
  };
  EXPECT_EQ(difference(R"({"tensors": [{"name": "conv1.weight", "shape": [6, 1, 5, 5]},
                                       {"name": "conv1.bias", "shape": [6]}]})"),
            "the shards' model has conv1.weight [16,1,5,5] at position 0 where this one has "
            "conv1.weight [6,1,5,5]");
  EXPECT_EQ(difference(R"({"tensors": [{"name": "conv1.weight", "shape": [16, 1, 5, 5]},
                                       {"name": "bias", "shape": [16]},
                                       {"name": "scale", "shape": []}]})"),
            "the shards' model has conv1.bias [16] at position 1 where this one has bias [16]");
  EXPECT_EQ(difference(R"({"tensors": [{"name": "conv1.weight", "shape": [16, 1, 5, 5]},
                                       {"name": "conv1.bias", "shape": [16]}]})"),
            "the shards' model has scale [] at position 2 where this one has no tensor (it "
            "has 2)");
  EXPECT_EQ(difference(R"({"tensors": [{"name": "conv1.weight", "shape": [16, 1, 5, 5]},
                                       {"name": "conv1.bias", "shape": [16]},
                                       {"name": "scale", "shape": []},
                                       {"name": "fc.bias", "shape": [10]}]})"),
            "the shards' model has no tensor (it has 3) at position 3 where this one has "
            "fc.bias [10]");
  EXPECT_EQ(difference(R"({"tensors": [{"name": "conv1.weight", "shape": [16, 1, 5, 5]},
                                       {"name": "conv1.bias", "shape": [16]},
                                       {"name": "scale", "shape": [], "buffer": true}]})"),
            "the shards' model has scale [] at position 2 where this one has scale [] (a "
            "buffer)");
}

TEST(TensorLayoutTest, AModelSpecMayBeALayoutInlineOrInAFile) {
  const std::string path = NewRunDir("tensor_layout") + "/model.json";
  std::ofstream(path) << kLayout;
  EXPECT_TRUE(IsLayoutSpec(path));
  EXPECT_TRUE(IsLayoutSpec(std::string("  ") + kLayout));
  EXPECT_FALSE(IsLayoutSpec("mlp:784-10"));
  const std::string fingerprint = ParseTensorLayout(kLayout)->Fingerprint();
  for (const std::string& spec : {std::string(kLayout), path}) {
    absl::StatusOr<ModelIdentity> model = ParseModelSpec(spec, 2);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ(model->fingerprint, fingerprint);
    EXPECT_EQ(model->total_params, 417);
    EXPECT_EQ(model->num_shards, 2);
    // What travels on to other processes is the layout itself, not the file's name.
    EXPECT_EQ(*ResolveModelSpec(spec, "ignored"), ParseTensorLayout(kLayout)->ToJson());
    EXPECT_EQ(ModelTensors(spec)->size(), 3u);
  }
  EXPECT_EQ(ParseModelSpec(path + ".gone.json", 1).status().code(), absl::StatusCode::kNotFound);
  // The other kinds keep their canonical spec and have tensors too.
  EXPECT_EQ(*ResolveModelSpec("", "32"), "mlp:784-32-10");
  EXPECT_EQ(*ResolveModelSpec("flat:007", ""), "flat:7");
  std::vector<TensorSlot> flat = *ModelTensors("flat:7");
  ASSERT_EQ(flat.size(), 1u);
  EXPECT_EQ(flat[0].name, "params");
  EXPECT_EQ(flat[0].shape, (std::vector<int64_t>{7}));
  EXPECT_EQ(ModelTensors("mlp:4-3-2")->size(), 4u);
}

TEST(TensorLayoutTest, BadLayoutsNameTheProblem) {
  for (auto [spec, why] : std::vector<std::pair<std::string, std::string>>{
           {"{", "not valid JSON"},
           {R"({"tensors": []})", "\"tensors\" must be a non-empty array"},
           {R"({"tensors": [{"name": "a", "shape": [2]}], "dtype": "f16"})",
            "unknown key \"dtype\""},
           {R"({"tensors": [{"name": "a", "shape": [2], "dtype": "f16"}]})",
            "tensor 0: unknown key \"dtype\" (expected name, shape, buffer)"},
           {R"({"tensors": [{"shape": [2]}]})", "tensor 0: needs a string \"name\""},
           {R"({"tensors": [{"name": "", "shape": [2]}]})", "1 to 256 bytes"},
           {R"({"tensors": [{"name": "a\nb", "shape": [2]}]})", "control characters"},
           {R"({"tensors": [{"name": "a"}]})", "a needs a \"shape\" array"},
           {R"({"tensors": [{"name": "a", "shape": [2, 0]}]})",
            "a has dimension 0; dimensions must be integers in [1, 2^40]"},
           {R"({"tensors": [{"name": "a", "shape": [2.5]}]})", "has dimension 2.5"},
           {R"({"tensors": [{"name": "a", "shape": [1048576, 1048577]}]})",
            "more than 2^40 parameters"},
           {R"({"tensors": [{"name": "a", "shape": [1099511627776]},
                            {"name": "b", "shape": [1]}]})",
            "tensor 1: the model has more than 2^40 parameters"},
           {R"({"tensors": [{"name": "a", "shape": [2]}, {"name": "a", "shape": [3]}]})",
            "tensor name \"a\" appears twice"},
           {R"({"tensors": [{"name": "__metadata__", "shape": [2]}]})",
            "safetensors' own key"},
           {R"({"tensors": [{"name": "a", "shape": [1099511627776]}, {"name": "s", "shape": []}]})",
            "tensor 1: the model has more than 2^40 parameters"}}) {
    absl::StatusOr<ModelIdentity> model = ParseModelSpec(spec, 1);
    ASSERT_FALSE(model.ok()) << spec;
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_NE(model.status().message().find(why), std::string::npos) << model.status();
    EXPECT_NE(model.status().message().find("bad model layout: "), std::string::npos);
  }
}

}  // namespace
}  // namespace ps
