// A shard's checkpoints in a directory, as safetensors files (common/safetensors.h) named
// shard-<index>-<version, 12 digits>.safetensors. Tensors: "values" and "optimizer.<slot>"
// (one value per element of the shard's range), "round.sum" when a sync round is open. Metadata
// (strings): "format" = "ps.shard.v1", "model", "shard_index", "num_shards", "optimizer",
// "consistency", "version", "workers" (JSON: [{"id", "last_sequence", "clock",
// "pushes_applied", "joined_at_version", "incarnation"}]), "round_contributors" (JSON list),
// "crc32".
// Not thread-safe.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "server/parameter_shard.h"

namespace ps {

class CheckpointStore {
 public:
  // Keeps the newest `keep` (>= 1) checkpoints of shard `shard_index` in `dir` (created if
  // missing).
  CheckpointStore(std::string dir, int shard_index, int keep);

  // Writes `checkpoint` atomically, then deletes the oldest beyond `keep`. Returns the path.
  absl::StatusOr<std::string> Write(const ShardCheckpoint& checkpoint);
  // The newest checkpoint that reads back whole, skipping (and logging) torn or corrupt ones;
  // nullopt if there is none. Fails only if the directory cannot be read.
  absl::StatusOr<std::optional<ShardCheckpoint>> LoadNewest();

 private:
  // This shard's checkpoint files, oldest first.
  absl::StatusOr<std::vector<std::string>> Files() const;

  std::string dir_;
  int shard_index_;
  int keep_;
};

// A checkpoint file as the shard wrote it (exposed for tests and tools).
absl::StatusOr<ShardCheckpoint> ReadShardCheckpoint(const std::string& path);

}  // namespace ps
