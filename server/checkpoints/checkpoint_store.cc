#include "server/checkpoints/checkpoint_store.h"

#include <google/protobuf/util/json_util.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/safetensors.h"

namespace ps {
namespace {

constexpr char kFormat[] = "ps.shard.v1";

std::string Prefix(int shard_index) { return absl::StrCat("shard-", shard_index, "-"); }

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// Field `f` of `m` (its element `i` if repeated) as JSON, integers as numbers (protobuf's own
// JSON printer writes 64-bit ones as strings).
nlohmann::json FieldValue(const Message& m, const FieldDescriptor* f, int i);

nlohmann::json MessageToJson(const Message& m) {
  nlohmann::json out = nlohmann::json::object();
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  for (int k = 0; k < d->field_count(); ++k) {
    const FieldDescriptor* f = d->field(k);
    if (!f->is_repeated()) {
      out[f->name()] = FieldValue(m, f, -1);
      continue;
    }
    nlohmann::json list = nlohmann::json::array();
    for (int i = 0; i < m.GetReflection()->FieldSize(m, f); ++i)
      list.push_back(FieldValue(m, f, i));
    out[f->name()] = std::move(list);
  }
  return out;
}

nlohmann::json FieldValue(const Message& m, const FieldDescriptor* f, int i) {
  const google::protobuf::Reflection* r = m.GetReflection();
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return rep ? r->GetRepeatedInt32(m, f, i) : r->GetInt32(m, f);
    case FieldDescriptor::CPPTYPE_INT64:
      return rep ? r->GetRepeatedInt64(m, f, i) : r->GetInt64(m, f);
    case FieldDescriptor::CPPTYPE_UINT32:
      return rep ? r->GetRepeatedUInt32(m, f, i) : r->GetUInt32(m, f);
    case FieldDescriptor::CPPTYPE_UINT64:
      return rep ? r->GetRepeatedUInt64(m, f, i) : r->GetUInt64(m, f);
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return rep ? r->GetRepeatedDouble(m, f, i) : r->GetDouble(m, f);
    case FieldDescriptor::CPPTYPE_FLOAT:
      return rep ? r->GetRepeatedFloat(m, f, i) : r->GetFloat(m, f);
    case FieldDescriptor::CPPTYPE_BOOL:
      return rep ? r->GetRepeatedBool(m, f, i) : r->GetBool(m, f);
    case FieldDescriptor::CPPTYPE_ENUM:
      return (rep ? r->GetRepeatedEnum(m, f, i) : r->GetEnum(m, f))->name();
    case FieldDescriptor::CPPTYPE_STRING:
      return rep ? r->GetRepeatedString(m, f, i) : r->GetString(m, f);
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return MessageToJson(rep ? r->GetRepeatedMessage(m, f, i) : r->GetMessage(m, f));
  }
  return nullptr;
}

// The state's header but its tensor list (the file's tensors are that) as metadata.
std::map<std::string, std::string> ToMetadata(const v1::ShardState& h) {
  std::map<std::string, std::string> metadata;
  const nlohmann::json fields = MessageToJson(h);
  for (const auto& [name, value] : fields.items()) {
    if (name == "tensors") continue;
    metadata[name] = value.is_string() ? value.get<std::string>() : value.dump();
  }
  return metadata;
}

// The header from the metadata ToMetadata wrote (keys that are no field of it are ignored).
absl::Status FromMetadata(const std::map<std::string, std::string>& metadata, v1::ShardState* h) {
  nlohmann::json fields = nlohmann::json::object();
  const google::protobuf::Descriptor* d = h->GetDescriptor();
  for (const auto& [name, text] : metadata) {
    const FieldDescriptor* f = d->FindFieldByName(name);
    if (f == nullptr || name == "tensors") continue;
    if (f->is_repeated() || f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE ||
        f->cpp_type() == FieldDescriptor::CPPTYPE_BOOL) {
      fields[name] = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (fields[name].is_discarded()) return absl::DataLossError("bad " + name + " metadata");
    } else {
      fields[name] = text;  // numbers too: protobuf's JSON takes them quoted
    }
  }
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  if (auto s = google::protobuf::util::JsonStringToMessage(fields.dump(), h, options); !s.ok()) {
    return absl::DataLossError("bad metadata: " + s.ToString());
  }
  return absl::OkStatus();
}

}  // namespace

CheckpointStore::CheckpointStore(std::string dir, int shard_index, int keep)
    : dir_(std::move(dir)), shard_index_(shard_index), keep_(std::max(keep, 1)) {
  std::error_code ignored;  // a directory that cannot be made fails the first Write
  std::filesystem::create_directories(dir_, ignored);
}

absl::StatusOr<std::vector<std::string>> CheckpointStore::Files() const {
  std::error_code error;
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, error)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(Prefix(shard_index_), 0) == 0 && entry.path().extension() == ".safetensors") {
      files.push_back(entry.path().string());
    }
  }
  if (error) return absl::UnavailableError("cannot read " + dir_ + ": " + error.message());
  std::sort(files.begin(), files.end());  // the zero-padded version orders them
  return files;
}

absl::StatusOr<std::string> CheckpointStore::Write(const ShardState& state) {
  const v1::ShardState& h = state.header;
  std::vector<TensorView> tensors;
  for (int i = 0; i < h.tensors_size(); ++i) {
    const std::vector<float>& values = state.tensors[i];
    tensors.push_back({h.tensors(i), {static_cast<int64_t>(values.size())}, values});
  }
  std::map<std::string, std::string> metadata = ToMetadata(h);
  metadata["format"] = kFormat;
  std::string path =
      absl::StrFormat("%s/%s%012d.safetensors", dir_, Prefix(h.shard_index()), h.version());
  if (absl::Status s = WriteSafetensors(path, tensors, std::move(metadata)); !s.ok()) return s;
  absl::StatusOr<std::vector<std::string>> files = Files();
  if (!files.ok()) return files.status();
  for (size_t i = 0; i + keep_ < files->size(); ++i) std::remove((*files)[i].c_str());
  return path;
}

absl::StatusOr<ShardState> ReadShardState(const std::string& path) {
  absl::StatusOr<Safetensors> file = ReadSafetensors(path);
  if (!file.ok()) return file.status();
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(path, ": ", why));
  };
  std::map<std::string, std::string>& m = file->metadata;
  if (m["format"] != kFormat) return bad("not a shard checkpoint (format " + m["format"] + ")");
  ShardState state;
  if (absl::Status s = FromMetadata(m, &state.header); !s.ok()) return bad(s.message());
  for (auto& [name, tensor] : file->tensors) {
    state.AddTensor(name) = std::move(tensor.data);
  }
  return state;
}

absl::StatusOr<std::optional<ShardState>> CheckpointStore::LoadNewest(std::string* skipped) {
  absl::StatusOr<std::vector<std::string>> files = Files();
  if (!files.ok()) return files.status();
  for (auto it = files->rbegin(); it != files->rend(); ++it) {
    absl::StatusOr<ShardState> c = ReadShardState(*it);
    if (c.ok()) {
      absl::Status s = CheckStateInvariants(*c);
      if (s.ok()) return std::optional<ShardState>(*std::move(c));
      c = absl::DataLossError(absl::StrCat(*it, ": ", s.message()));
    }
    PS_LOG(WARNING) << "skipping a torn, corrupt or edited checkpoint: " << c.status().message();
    if (skipped != nullptr) {
      absl::StrAppend(skipped, skipped->empty() ? "" : "; ", c.status().message());
    }
  }
  return std::optional<ShardState>();
}

}  // namespace ps
