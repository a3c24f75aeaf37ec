#include "trainer/model_file.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_spec.h"
#include "common/safetensors.h"

namespace ps {
namespace {

constexpr char kFormat[] = "ps.model.v1";

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

// A model's fingerprint and tensors from one reading of its spec (a layout file is read once).
struct Described {
  ModelIdentity model;
  std::vector<TensorSlot> slots;
};
absl::StatusOr<Described> Describe(const std::string& spec) {
  if (spec.empty()) return absl::InvalidArgumentError("a model file needs its model");
  absl::StatusOr<std::string> canonical = ResolveModelSpec(spec, "");
  if (!canonical.ok()) return canonical.status();
  absl::StatusOr<ModelIdentity> model = ParseModelSpec(*canonical, 1);
  if (!model.ok()) return model.status();
  absl::StatusOr<std::vector<TensorSlot>> slots = ModelTensors(*canonical);
  if (!slots.ok()) return slots.status();
  return Described{*std::move(model), *std::move(slots)};
}

}  // namespace

absl::Status WriteModelFile(const std::string& path, const ModelFile& file) {
  absl::StatusOr<Described> described = Describe(file.model);
  if (!described.ok()) return described.status();
  const ModelIdentity& model = described->model;
  const std::vector<TensorSlot>& slots = described->slots;
  if (static_cast<int64_t>(file.params.size()) != model.total_params) {
    return absl::InvalidArgumentError(absl::StrCat(model.fingerprint, " has ", model.total_params,
                                                   " parameters, got ", file.params.size()));
  }
  if (file.versions.empty()) return absl::InvalidArgumentError("a model file needs its versions");
  std::vector<TensorView> tensors;
  for (const TensorSlot& slot : slots) {
    tensors.push_back(
        {slot.name, slot.shape, absl::MakeConstSpan(file.params).subspan(slot.offset, slot.size)});
  }
  return WriteSafetensors(path, tensors,
                          {{"format", kFormat},
                           {"model", model.fingerprint},
                           {"versions", nlohmann::json(file.versions).dump()}});
}

absl::StatusOr<ModelFile> ReadModelFile(const std::string& path,
                                        const std::string& expected_model) {
  absl::StatusOr<Described> described = Describe(expected_model);
  if (!described.ok()) return described.status();
  const ModelIdentity& model = described->model;
  const std::vector<TensorSlot>& slots = described->slots;
  absl::StatusOr<Safetensors> read = ReadSafetensors(path);
  if (!read.ok()) return read.status();
  auto bad = [&](const std::string& why) { return absl::InvalidArgumentError(path + ": " + why); };
  std::map<std::string, std::string>& metadata = read->metadata;
  if (metadata["format"] != kFormat) {
    return bad(absl::StrCat("not a model file (format '", metadata["format"], "', expected '",
                            kFormat, "'); export_model writes them"));
  }
  if (metadata["model"] != model.fingerprint) {
    return bad(absl::StrCat("holds model ", metadata["model"], ", expected ", model.fingerprint));
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
  file.params.resize(model.total_params);
  for (const TensorSlot& slot : slots) {
    auto it = read->tensors.find(slot.name);
    if (it == read->tensors.end()) return bad("has no tensor " + slot.name);
    if (it->second.shape != slot.shape) {
      return bad(absl::StrCat(slot.name, " has shape ", ShapeText(it->second.shape), ", expected ",
                              ShapeText(slot.shape),
                              IsLayoutSpec(expected_model)
                                  ? ""
                                  : " (weights are [in, out], convolutions [K, K, C_in, C_out])"));
    }
    std::copy(it->second.data.begin(), it->second.data.end(), file.params.begin() + slot.offset);
    read->tensors.erase(it);
  }
  if (!read->tensors.empty()) {
    return bad(absl::StrCat("has a tensor ", read->tensors.begin()->first, " that ",
                            model.fingerprint, " does not"));
  }
  return file;
}

}  // namespace ps
