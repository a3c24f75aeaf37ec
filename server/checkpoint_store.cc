#include "server/checkpoint_store.h"

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

absl::StatusOr<std::string> CheckpointStore::Write(const ShardCheckpoint& c) {
  std::vector<TensorView> tensors;
  const int64_t n = static_cast<int64_t>(c.values.size());
  tensors.push_back({"values", {n}, c.values});
  for (const auto& [slot, state] : c.optimizer_state) {
    tensors.push_back({"optimizer." + slot, {n}, state});
  }
  if (!c.round_sum.empty()) tensors.push_back({"round.sum", {n}, c.round_sum});
  nlohmann::json workers = nlohmann::json::array();
  for (const ShardCheckpoint::Worker& w : c.workers) {
    workers.push_back({{"id", w.id},
                       {"last_sequence", w.last_sequence},
                       {"clock", w.clock},
                       {"pushes_applied", w.pushes_applied},
                       {"joined_at_version", w.joined_at_version},
                       {"incarnation", w.incarnation}});
  }
  std::map<std::string, std::string> metadata = {
      {"format", kFormat},
      {"model", c.model},
      {"shard_index", absl::StrCat(c.shard_index)},
      {"num_shards", absl::StrCat(c.num_shards)},
      {"optimizer", c.optimizer},
      {"consistency", c.consistency},
      {"version", absl::StrCat(c.version)},
      {"workers", workers.dump()},
      {"round_contributors", nlohmann::json(c.round_contributors).dump()}};
  std::string path =
      absl::StrFormat("%s/%s%012d.safetensors", dir_, Prefix(c.shard_index), c.version);
  if (absl::Status s = WriteSafetensors(path, tensors, std::move(metadata)); !s.ok()) return s;
  absl::StatusOr<std::vector<std::string>> files = Files();
  if (!files.ok()) return files.status();
  for (size_t i = 0; i + keep_ < files->size(); ++i) std::remove((*files)[i].c_str());
  return path;
}

absl::StatusOr<ShardCheckpoint> ReadShardCheckpoint(const std::string& path) {
  absl::StatusOr<Safetensors> file = ReadSafetensors(path);
  if (!file.ok()) return file.status();
  auto bad = [&](const std::string& why) { return absl::DataLossError(path + ": " + why); };
  std::map<std::string, std::string>& m = file->metadata;
  if (m["format"] != kFormat) return bad("not a shard checkpoint (format " + m["format"] + ")");
  ShardCheckpoint c;
  c.model = m["model"];
  c.optimizer = m["optimizer"];
  c.consistency = m["consistency"];
  if (!absl::SimpleAtoi(m["shard_index"], &c.shard_index) ||
      !absl::SimpleAtoi(m["num_shards"], &c.num_shards) ||
      !absl::SimpleAtoi(m["version"], &c.version)) {
    return bad("shard_index, num_shards or version is not a number");
  }
  nlohmann::json workers = nlohmann::json::parse(m["workers"], nullptr, false);
  nlohmann::json contributors = nlohmann::json::parse(m["round_contributors"], nullptr, false);
  if (!workers.is_array() || !contributors.is_array()) return bad("bad workers metadata");
  auto integer = [](const nlohmann::json& o, const char* key) {
    return o.is_object() && o.contains(key) && o[key].is_number_integer();
  };
  for (const nlohmann::json& w : workers) {
    if (!integer(w, "id") || !integer(w, "last_sequence") || !integer(w, "clock") ||
        !integer(w, "pushes_applied") || !integer(w, "joined_at_version") ||
        !integer(w, "incarnation")) {
      return bad("bad worker entry " + w.dump());
    }
    c.workers.push_back({w["id"].get<int>(), w["last_sequence"].get<int64_t>(),
                         w["clock"].get<int64_t>(), w["pushes_applied"].get<int64_t>(),
                         w["joined_at_version"].get<int64_t>(), w["incarnation"].get<int64_t>()});
  }
  for (const nlohmann::json& id : contributors) {
    if (!id.is_number_integer()) return bad("bad round contributor");
    c.round_contributors.push_back(id.get<int>());
  }
  for (auto& [name, tensor] : file->tensors) {
    if (name == "values") {
      c.values = std::move(tensor.data);
    } else if (name == "round.sum") {
      c.round_sum = std::move(tensor.data);
    } else if (name.rfind("optimizer.", 0) == 0) {
      c.optimizer_state.emplace_back(name.substr(10), std::move(tensor.data));
    }
  }
  return c;
}

absl::StatusOr<std::optional<ShardCheckpoint>> CheckpointStore::LoadNewest(std::string* skipped) {
  absl::StatusOr<std::vector<std::string>> files = Files();
  if (!files.ok()) return files.status();
  for (auto it = files->rbegin(); it != files->rend(); ++it) {
    absl::StatusOr<ShardCheckpoint> c = ReadShardCheckpoint(*it);
    if (c.ok()) return std::optional<ShardCheckpoint>(*std::move(c));
    PS_LOG(WARNING) << "skipping a checkpoint that does not read back: " << c.status().message();
    if (skipped != nullptr) {
      absl::StrAppend(skipped, skipped->empty() ? "" : "; ", c.status().message());
    }
  }
  return std::optional<ShardCheckpoint>();
}

}  // namespace ps
