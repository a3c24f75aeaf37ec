#include "common/model_spec.h"

#include <limits>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/network_spec.h"

namespace ps {
namespace {

constexpr int64_t kMaxParams = int64_t{1} << 40;

absl::Status Bad(const std::string& spec, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "bad model spec '", spec, "': ", why,
      " (expected mlp:IN-H1-...-OUT, cnn:..., flat:N, or a tensor layout: {...} or FILE.json)"));
}

// A spec's kind ("mlp" or "flat"), sizes and parameter count, validated.
struct ParsedSpec {
  std::string kind;
  std::vector<int64_t> sizes;
  int64_t total = 0;
};

absl::StatusOr<ParsedSpec> Parse(const std::string& spec) {
  std::vector<std::string> kind_and_shape = absl::StrSplit(spec, absl::MaxSplits(':', 1));
  if (kind_and_shape.size() != 2) return Bad(spec, "no ':'");
  ParsedSpec parsed;
  parsed.kind = kind_and_shape[0];
  std::vector<int64_t>& sizes = parsed.sizes;
  for (absl::string_view part : absl::StrSplit(kind_and_shape[1], '-')) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1 || n > kMaxParams) {
      return Bad(spec, absl::StrCat("size '", part, "' is not a number in [1, 2^40]"));
    }
    sizes.push_back(n);
  }
  int64_t& total = parsed.total;
  if (parsed.kind == "flat") {
    if (sizes.size() != 1) return Bad(spec, "flat takes one size");
    total = sizes[0];
  } else if (parsed.kind == "mlp") {
    if (sizes.size() < 2) return Bad(spec, "an mlp needs at least inputs and outputs");
    for (size_t i = 0; i + 1 < sizes.size() && total <= kMaxParams; ++i) {
      // Each factor is <= 2^40, so the product fits in 128 bits; compare before narrowing.
      __int128 layer = static_cast<__int128>(sizes[i]) * sizes[i + 1] + sizes[i + 1];
      total = layer > kMaxParams ? kMaxParams + 1 : total + static_cast<int64_t>(layer);
    }
  } else {
    return Bad(spec, absl::StrCat("unknown kind '", parsed.kind, "'"));
  }
  if (total > kMaxParams) return Bad(spec, "more than 2^40 parameters");
  return parsed;
}

}  // namespace

absl::StatusOr<ModelIdentity> ParseModelSpec(const std::string& spec, int num_shards) {
  if (IsLayoutSpec(spec)) {
    absl::StatusOr<TensorLayout> layout = ParseTensorLayout(spec);
    if (!layout.ok()) return layout.status();
    return ModelIdentity{layout->Fingerprint(), layout->num_params(), num_shards,
                         layout->num_buffer_values(), layout->ToJson()};
  }
  if (absl::StartsWith(spec, "cnn")) {  // a cnn:... spec or a preset
    absl::StatusOr<NetworkSpec> net = ResolveModel(spec, "");
    if (!net.ok()) return net.status();
    return ModelIdentity{net->ToString(), net->num_params(), num_shards};
  }
  absl::StatusOr<ParsedSpec> parsed = Parse(spec);
  if (!parsed.ok()) return parsed.status();
  // Canonical: the numbers as parsed (mlp:784-0256-10 is mlp:784-256-10).
  return ModelIdentity{absl::StrCat(parsed->kind, ":", absl::StrJoin(parsed->sizes, "-")),
                       parsed->total, num_shards};
}

absl::StatusOr<std::string> ResolveModelSpec(const std::string& model, const std::string& hidden) {
  if (IsLayoutSpec(model)) {
    absl::StatusOr<TensorLayout> layout = ParseTensorLayout(model);
    if (!layout.ok()) return layout.status();
    return layout->ToJson();
  }
  if (absl::StartsWith(model, "flat:")) {
    absl::StatusOr<ModelIdentity> flat = ParseModelSpec(model, 1);
    if (!flat.ok()) return flat.status();
    return flat->fingerprint;
  }
  absl::StatusOr<NetworkSpec> network = ResolveModel(model, hidden);
  if (!network.ok()) return network.status();
  return network->ToString();
}

absl::StatusOr<std::vector<TensorSlot>> ModelTensors(const std::string& spec) {
  if (IsLayoutSpec(spec)) {
    absl::StatusOr<TensorLayout> layout = ParseTensorLayout(spec);
    if (!layout.ok()) return layout.status();
    return std::move(layout->tensors);
  }
  if (absl::StartsWith(spec, "flat:")) {
    absl::StatusOr<ModelIdentity> flat = ParseModelSpec(spec, 1);
    if (!flat.ok()) return flat.status();
    return std::vector<TensorSlot>{{"params", {flat->total_params}, 0, flat->total_params}};
  }
  absl::StatusOr<NetworkSpec> network = ResolveModel(spec, "");
  if (!network.ok()) return network.status();
  return TensorSlots(*network);
}

absl::StatusOr<std::vector<int>> ParseMlpSpec(const std::string& spec) {
  absl::StatusOr<ParsedSpec> parsed = Parse(spec);
  if (!parsed.ok()) return parsed.status();
  if (parsed->kind != "mlp") {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", spec, "' is not an mlp:IN-H1-...-OUT"));
  }
  std::vector<int> sizes;
  for (int64_t size : parsed->sizes) {
    if (size > std::numeric_limits<int>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model '", spec, "' has a layer wider than 2^31-1"));
    }
    sizes.push_back(static_cast<int>(size));
  }
  return sizes;
}

absl::StatusOr<std::vector<int>> MlpLayerSizes(int inputs, const std::string& hidden, int classes) {
  std::vector<int> sizes = {inputs};
  for (absl::string_view h : absl::StrSplit(hidden, ',', absl::SkipWhitespace())) {
    int size = 0;
    if (!absl::SimpleAtoi(h, &size) || size <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad hidden layer size '", h, "': expected positive integers like 256,128"));
    }
    sizes.push_back(size);
  }
  sizes.push_back(classes);
  return sizes;
}

std::string MlpSpec(const std::vector<int>& sizes) { return "mlp:" + absl::StrJoin(sizes, "-"); }

}  // namespace ps
