#include "worker/model_file.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_spec.h"
#include "common/safetensors.h"
#include "worker/network.h"

namespace ps {
namespace {

constexpr char kFormat[] = "ps.model.v1";

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

}  // namespace

absl::Status WriteModelFile(const std::string& path, const ModelFile& file) {
  absl::StatusOr<NetworkSpec> network = ParseNetworkSpec(file.model);
  if (!network.ok()) return network.status();
  std::vector<TensorSlot> slots = TensorSlots(*network);
  const int64_t expected = slots.back().offset + slots.back().size;
  if (static_cast<int64_t>(file.params.size()) != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.model, " has ", expected, " parameters, got ", file.params.size()));
  }
  if (file.versions.empty()) return absl::InvalidArgumentError("a model file needs its versions");
  std::vector<TensorView> tensors;
  for (const TensorSlot& slot : slots) {
    tensors.push_back(
        {slot.name, slot.shape, absl::MakeConstSpan(file.params).subspan(slot.offset, slot.size)});
  }
  return WriteSafetensors(path, tensors,
                          {{"format", kFormat},
                           {"model", file.model},
                           {"versions", nlohmann::json(file.versions).dump()}});
}

absl::StatusOr<ModelFile> ReadModelFile(const std::string& path,
                                        const std::string& expected_model) {
  absl::StatusOr<NetworkSpec> network = ParseNetworkSpec(expected_model);
  if (!network.ok()) return network.status();
  absl::StatusOr<Safetensors> read = ReadSafetensors(path);
  if (!read.ok()) return read.status();
  auto bad = [&](const std::string& why) { return absl::InvalidArgumentError(path + ": " + why); };
  std::map<std::string, std::string>& metadata = read->metadata;
  if (metadata["format"] != kFormat) {
    return bad(absl::StrCat("not a model file (format '", metadata["format"], "', expected '",
                            kFormat, "'); export_model writes them"));
  }
  if (metadata["model"] != expected_model) {
    return bad(absl::StrCat("holds model ", metadata["model"], ", expected ", expected_model));
  }
  ModelFile file;
  file.model = expected_model;
  nlohmann::json versions = nlohmann::json::parse(metadata["versions"], nullptr, false);
  if (!versions.is_array() || versions.empty()) {
    return bad("metadata 'versions' is not a non-empty JSON list");
  }
  for (const nlohmann::json& v : versions) {
    if (!v.is_number_integer()) return bad("metadata 'versions' holds a non-integer");
    file.versions.push_back(v.get<int64_t>());
  }
  std::vector<TensorSlot> slots = TensorSlots(*network);
  file.params.resize(slots.back().offset + slots.back().size);
  for (const TensorSlot& slot : slots) {
    auto it = read->tensors.find(slot.name);
    if (it == read->tensors.end()) return bad("has no tensor " + slot.name);
    if (it->second.shape != slot.shape) {
      return bad(absl::StrCat(slot.name, " has shape ", ShapeText(it->second.shape), ", expected ",
                              ShapeText(slot.shape),
                              " (weights are [in, out], convolutions [K, K, C_in, C_out])"));
    }
    std::copy(it->second.data.begin(), it->second.data.end(), file.params.begin() + slot.offset);
    read->tensors.erase(it);
  }
  if (!read->tensors.empty()) {
    return bad(absl::StrCat("has a tensor ", read->tensors.begin()->first, " that ", expected_model,
                            " does not"));
  }
  return file;
}

}  // namespace ps
