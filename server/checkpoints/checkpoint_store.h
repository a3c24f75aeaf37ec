// A shard's checkpoints in a directory, as safetensors files (common/safetensors.h) named
// shard-<index>-<version, 12 digits>.safetensors, each one ShardState (server/state/shard_state.h).
// Tensors: the state's ("values", "optimizer.<slot>", "round.sum" while a round is open), one
// value per element of the shard's range. Metadata (strings): "format" = "ps.shard.v1", then every
// field of the state's header (proto/shard_state.proto) but its tensor list, by field name:
// scalars as text ("version" = "1400"), the others as JSON ("workers" = [{"id", "last_sequence",
// "clock", "pushes_applied", "joined_at_version", "incarnation"}], "round_contributors" = [0, 2]);
// and "file_crc32" (the whole file's checksum: common/safetensors.h). A field added to the schema
// is written and read without a change here.
// A file changed anywhere after it was written (a tensor, or metadata such as "version" or a
// worker's "last_sequence") is refused like a torn one, and so is one whose checksum was
// recomputed after such an edit if its state no longer agrees with itself (CheckStateInvariants).
// Files written before the whole-file checksum (their "crc32" covered the tensors only) still
// read: common/safetensors.h.
// Not thread-safe.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "server/state/shard_state.h"

namespace ps {

class CheckpointStore {
 public:
  // Keeps the newest `keep` (>= 1) checkpoints of shard `shard_index` in `dir` (created if
  // missing).
  CheckpointStore(std::string dir, int shard_index, int keep);

  // Writes `state` (which holds a model) atomically, then deletes the oldest beyond `keep`.
  // Returns the path.
  absl::StatusOr<std::string> Write(const ShardState& state);
  // The newest checkpoint that reads back whole and agrees with itself, skipping (and logging)
  // torn, corrupt or edited ones (see ReadShardState) and those whose state breaks an invariant
  // (CheckStateInvariants, DATA_LOSS naming the file: e.g. an edited version, its checksum
  // recomputed); nullopt if there is none. `skipped` (if not null) gets why each newer file was
  // skipped, naming it, "; "-joined. Fails only if the directory cannot be read.
  absl::StatusOr<std::optional<ShardState>> LoadNewest(std::string* skipped = nullptr);

 private:
  // This shard's checkpoint files, oldest first.
  absl::StatusOr<std::vector<std::string>> Files() const;

  std::string dir_;
  int shard_index_;
  int keep_;
};

// A checkpoint file as the shard wrote it (exposed for tests and tools); DATA_LOSS naming the
// file if it is torn, corrupt or was changed since (the message says "checksum").
absl::StatusOr<ShardState> ReadShardState(const std::string& path);

}  // namespace ps
