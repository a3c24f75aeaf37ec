#include "common/tensor_layout.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace ps {
namespace {

using Json = nlohmann::json;

constexpr int64_t kMaxParams = int64_t{1} << 40;
constexpr int64_t kMaxFileBytes = 16 << 20;
constexpr size_t kMaxName = 256;

absl::StatusOr<std::string> ReadLayoutFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open model layout file ", path));
  std::string text(kMaxFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return absl::InvalidArgumentError("cannot read model layout file " + path);
  text.resize(static_cast<size_t>(in.gcount()));
  if (static_cast<int64_t>(text.size()) > kMaxFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("model layout file ", path, " is larger than 16 MiB"));
  }
  return text;
}

absl::StatusOr<TensorSlot> ParseTensor(const Json& t, size_t index, int64_t offset) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", index, ": ", why));
  };
  if (!t.is_object()) return bad("must be an object {\"name\": ..., \"shape\": [...]}");
  for (const auto& [key, value] : t.items()) {
    if (key != "name" && key != "shape" && key != "buffer") {
      return bad(absl::StrCat("unknown key \"", key, "\" (expected name, shape, buffer)"));
    }
  }
  if (!t.contains("name") || !t["name"].is_string()) return bad("needs a string \"name\"");
  TensorSlot slot;
  slot.name = t["name"].get<std::string>();
  if (slot.name.empty() || slot.name.size() > kMaxName) {
    return bad("a name must be 1 to 256 bytes long");
  }
  if (slot.name == "__metadata__") return bad("__metadata__ is safetensors' own key, not a name");
  for (char c : slot.name) {
    if (absl::ascii_iscntrl(static_cast<unsigned char>(c))) {
      return bad("a name may not hold control characters");
    }
  }
  if (!t.contains("shape") || !t["shape"].is_array()) {
    return bad(absl::StrCat(slot.name, " needs a \"shape\" array"));
  }
  if (t["shape"].size() > 16) return bad(absl::StrCat(slot.name, " has more than 16 dimensions"));
  slot.size = 1;
  for (const Json& d : t["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() < 1 || d.get<int64_t>() > kMaxParams) {
      return bad(absl::StrCat(slot.name, " has dimension ", d.dump(),
                              "; dimensions must be integers in [1, 2^40]"));
    }
    slot.shape.push_back(d.get<int64_t>());
    // Both factors are <= 2^40 here, so the product fits in 128 bits.
    __int128 size = static_cast<__int128>(slot.size) * slot.shape.back();
    if (size + offset > kMaxParams) return bad("the model has more than 2^40 parameters");
    slot.size = static_cast<int64_t>(size);
  }
  if (slot.size + offset > kMaxParams) return bad("the model has more than 2^40 parameters");
  if (t.contains("buffer")) {
    if (!t["buffer"].is_boolean())
      return bad(absl::StrCat(slot.name, ": \"buffer\" is true or false"));
    slot.buffer = t["buffer"].get<bool>();
  }
  slot.offset = offset;
  return slot;
}

}  // namespace

int64_t TensorLayout::num_params() const {
  return tensors.empty() ? 0 : tensors.back().offset + tensors.back().size;
}

int64_t TensorLayout::num_buffer_values() const {
  int64_t n = 0;
  for (const TensorSlot& t : tensors) n += t.buffer ? t.size : 0;
  return n;
}

std::string TensorLayout::ToJson() const {
  Json list = Json::array();
  for (const TensorSlot& t : tensors) {
    Json tensor = {{"name", t.name}, {"shape", t.shape}};
    if (t.buffer) tensor["buffer"] = true;  // absent otherwise: older layouts keep their text
    list.push_back(std::move(tensor));
  }
  return Json{{"tensors", list}}.dump();
}

std::string TensorLayout::Fingerprint() const {
  uint64_t hash = 14695981039346656037ull;  // FNV-1a, 64 bits
  for (unsigned char c : ToJson()) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return absl::StrFormat("layout:%d:%016x", num_params(), hash);
}

std::string LayoutDifference(const TensorLayout& a, absl::string_view a_name, const TensorLayout& b,
                             absl::string_view b_name) {
  auto describe = [](const TensorLayout& layout, size_t i) {
    if (i >= layout.tensors.size()) {
      return absl::StrCat("no tensor (it has ", layout.tensors.size(), ")");
    }
    const TensorSlot& t = layout.tensors[i];
    return absl::StrCat(t.name, " [", absl::StrJoin(t.shape, ","), "]",
                        t.buffer ? " (a buffer)" : "");
  };
  for (size_t i = 0; i < std::max(a.tensors.size(), b.tensors.size()); ++i) {
    const bool same =
        i < a.tensors.size() && i < b.tensors.size() && a.tensors[i].name == b.tensors[i].name &&
        a.tensors[i].shape == b.tensors[i].shape && a.tensors[i].buffer == b.tensors[i].buffer;
    if (!same) {
      return absl::StrCat(a_name, " has ", describe(a, i), " at position ", i, " where ", b_name,
                          " has ", describe(b, i));
    }
  }
  return "";
}

bool IsInlineLayout(const std::string& spec) {
  return absl::StartsWith(absl::StripLeadingAsciiWhitespace(spec), "{");
}

bool IsLayoutSpec(const std::string& spec) {
  return IsInlineLayout(spec) || absl::EndsWith(spec, ".json");
}

absl::StatusOr<TensorLayout> ParseTensorLayout(const std::string& spec) {
  const bool inline_json = IsInlineLayout(spec);
  std::string text = spec;
  if (!inline_json) {
    absl::StatusOr<std::string> read = ReadLayoutFile(spec);
    if (!read.ok()) return read.status();
    text = *std::move(read);
  } else if (static_cast<int64_t>(text.size()) > kMaxFileBytes) {
    return absl::InvalidArgumentError("a model layout is larger than 16 MiB");
  }
  const std::string where = inline_json ? "model layout" : "model layout file " + spec;
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad ", where, ": ", why,
        " (expected {\"tensors\": [{\"name\": \"fc.weight\", \"shape\": [10, 784]}, ...]})"));
  };
  const Json root = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return bad("not valid JSON");
  if (!root.is_object()) return bad("not a JSON object");
  for (const auto& [key, value] : root.items()) {
    if (key != "tensors") return bad(absl::StrCat("unknown key \"", key, "\""));
  }
  if (!root.contains("tensors") || !root["tensors"].is_array() || root["tensors"].empty()) {
    return bad("\"tensors\" must be a non-empty array");
  }
  TensorLayout layout;
  std::set<std::string> names;
  int64_t offset = 0;
  for (const Json& t : root["tensors"]) {
    absl::StatusOr<TensorSlot> slot = ParseTensor(t, layout.tensors.size(), offset);
    if (!slot.ok()) return bad(std::string(slot.status().message()));
    if (!names.insert(slot->name).second) {
      return bad(absl::StrCat("tensor name \"", slot->name, "\" appears twice"));
    }
    if (!slot->buffer && !layout.tensors.empty() && layout.tensors.back().buffer) {
      return bad(absl::StrCat("parameter ", slot->name, " comes after buffer ",
                              layout.tensors.back().name, "; buffers come after all parameters"));
    }
    offset += slot->size;
    layout.tensors.push_back(*std::move(slot));
  }
  return layout;
}

}  // namespace ps
