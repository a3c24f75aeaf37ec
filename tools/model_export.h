// A job's whole model gathered for export (export_model): from the shards' checkpoint files or
// from the live shards, as a ModelFile (trainer/model_file.h) ready to be written. Free functions
// without shared state: safe to call from several threads.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/model_file.h"
#include "client/sharded_client.h"

namespace ps {

// The model in the newest checkpoint that reads back whole of every shard in `dir` (what `ps
// --checkpoint_dir=dir` would resume from; torn or corrupt newer files are skipped with a log
// line), which must be a job of `expected_model` (a model spec). Shard 0's checkpoint says how many
// shards the job has. Checkpoints carry no job id: shards are taken to be of one job when they
// agree on model, shard count, optimizer and consistency.
// Fails with NOT_FOUND if `dir` is not a directory or a shard has no checkpoint there (naming
// them), FAILED_PRECONDITION if the shards' checkpoints are of different jobs, INVALID_ARGUMENT if
// the job's model is not `expected_model` (saying to pass the layout when the job's is one),
// DATA_LOSS if a checkpoint does not hold its shard's range.
absl::StatusOr<ModelFile> ModelFromCheckpoints(const std::string& dir,
                                               const std::string& expected_model);

// The current model of the live shards at `addresses` (in shard order), read as an observer
// (worker id -1: a read-only token is enough). Each shard's part is read at that shard's version
// (ModelFile::versions): the shards of a running job are not stopped for it. Fails as
// ShardedClient's Register and Pull do (the shards serve another model, refuse the token, or
// stay unreachable for options.retry_for), naming the shard; shards of a tensor layout asked for
// another model (the tools' default MLP) fail with FAILED_PRECONDITION saying to pass the layout.
absl::StatusOr<ModelFile> ModelFromShards(const std::vector<std::string>& addresses,
                                          const std::string& model, const ClientOptions& options);

// Writes `file` to `out` (WriteModelFile) and returns the line that says so: "wrote MODEL
// (N parameters, versions [...]) to OUT in S s", timed from `start` (export_model, psctl export).
absl::StatusOr<std::string> WriteExport(const std::string& out, const ModelFile& file,
                                        absl::Time start);

}  // namespace ps
