#include "tools/model_export.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/model_spec.h"
#include "common/partition.h"
#include "proto/ps.pb.h"
#include "server/checkpoints/checkpoint_store.h"

namespace ps {
namespace {

// What makes checkpoints of one job, for messages: "mlp:784-32-10, 2 shards, adam, async".
std::string JobText(const ShardState& s) {
  const v1::ShardState& c = s.header;
  return absl::StrCat(c.model(), ", ", c.num_shards(), " shards, ", c.optimizer(), ", ",
                      c.consistency());
}

absl::StatusOr<ShardState> NewestCheckpoint(const std::string& dir, int shard) {
  std::string skipped;  // the shard resumes from the same file, skipping the same ones
  absl::StatusOr<std::optional<ShardState>> newest =
      CheckpointStore(dir, shard, /*keep=*/1).LoadNewest(&skipped);
  if (!newest.ok()) return newest.status();
  if (!newest->has_value()) {
    return absl::NotFoundError(absl::StrCat("no readable checkpoint of shard ", shard, " in ", dir,
                                            skipped.empty() ? "" : " (" + skipped + ")"));
  }
  return **std::move(newest);
}

// What to pass when the job's model (fingerprint `held`) is a tensor layout and `expected` is
// not one (export_model's --hidden MLP by default); "" otherwise.
std::string LayoutHint(const std::string& held, const ModelIdentity& expected) {
  if (!absl::StartsWith(held, "layout:") || !expected.layout.empty()) return "";
  return ": the job's model is a tensor layout, pass it as --model=FILE.json (the file the "
         "shards' --model named)";
}

}  // namespace

absl::StatusOr<ModelFile> ModelFromCheckpoints(const std::string& dir,
                                               const std::string& expected_model) {
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint directory ", dir));
  }
  absl::StatusOr<ShardState> first = NewestCheckpoint(dir, 0);
  if (!first.ok()) return first.status();
  const int num_shards = first->header.num_shards();
  absl::StatusOr<ModelIdentity> model = ParseModelSpec(expected_model, num_shards);
  if (!model.ok()) return model.status();
  if (first->header.model() != model->fingerprint) {
    return absl::InvalidArgumentError(
        absl::StrCat("the checkpoints in ", dir, " are of model ", first->header.model(),
                     ", expected ", model->fingerprint, LayoutHint(first->header.model(), *model)));
  }
  if (num_shards < 1) {
    return absl::DataLossError("shard 0's checkpoint in " + dir + " says the job has no shards");
  }
  ModelFile file{expected_model, {}, std::vector<float>(model->total_params)};
  // Checks that `c` is shard `shard` of shard 0's job and copies its values into place.
  auto add = [&](const ShardState& c, int shard) {
    if (JobText(c) != JobText(*first) || c.header.shard_index() != shard) {
      return absl::FailedPreconditionError(
          absl::StrCat("the checkpoints in ", dir, " are of different jobs: shard 0 is of (",
                       JobText(*first), "), the newest of shard ", shard, " is shard ",
                       c.header.shard_index(), " of (", JobText(c), ")"));
    }
    Range range = PartRange(model->total_params, shard, num_shards);
    const std::vector<float>* values = c.Find(kValuesTensor);
    const size_t held = values != nullptr ? values->size() : 0;
    if (static_cast<int64_t>(held) != range.size()) {
      return absl::DataLossError(absl::StrCat("the checkpoint of shard ", shard, " in ", dir,
                                              " holds ", held, " values, expected ", range.size()));
    }
    std::copy(values->begin(), values->end(), file.params.begin() + range.begin);
    file.versions.push_back(c.header.version());
    return absl::OkStatus();
  };
  if (absl::Status s = add(*first, 0); !s.ok()) return s;
  for (int shard = 1; shard < num_shards; ++shard) {
    absl::StatusOr<ShardState> c = NewestCheckpoint(dir, shard);
    if (!c.ok()) {
      return absl::Status(c.status().code(), absl::StrCat(c.status().message(), " (the job has ",
                                                          num_shards, " shards)"));
    }
    if (absl::Status s = add(*c, shard); !s.ok()) return s;
  }
  return file;
}

absl::StatusOr<ModelFile> ModelFromShards(const std::vector<std::string>& addresses,
                                          const std::string& model, const ClientOptions& options) {
  absl::StatusOr<ModelIdentity> identity =
      ParseModelSpec(model, static_cast<int>(addresses.size()));
  if (!identity.ok()) return identity.status();
  ShardedClient client(addresses, *identity, /*worker_id=*/-1, options);
  absl::StatusOr<std::vector<v1::StatsResponse>> stats = client.Stats();
  if (!stats.ok()) return stats.status();
  // Registering would refuse another model too, but say only that it differs.
  const std::string held = stats->empty() ? "" : stats->front().model_fingerprint();
  if (std::string hint = LayoutHint(held, *identity); !hint.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the shards hold model ", held, ", expected ", identity->fingerprint, hint));
  }
  if (absl::StatusOr<int64_t> r = client.Register(); !r.ok()) return r.status();
  // A pull would wait for an initialiser; an uninitialised job has nothing to export.
  for (size_t shard = 0; shard < stats->size(); ++shard) {
    if (!(*stats)[shard].initialized()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", shard, " (", addresses[shard], ") is not initialised yet: nothing to export"));
    }
  }
  ModelFile file{model, {}, std::vector<float>(identity->total_params)};
  absl::StatusOr<ShardedClient::Versions> pulled = client.Pull(absl::MakeSpan(file.params));
  if (!pulled.ok()) return pulled.status();
  file.versions = pulled->version;
  return file;
}

absl::StatusOr<std::string> WriteExport(const std::string& out, const ModelFile& file,
                                        absl::Time start) {
  if (absl::Status s = WriteModelFile(out, file); !s.ok()) return s;
  absl::StatusOr<ModelIdentity> model = ParseModelSpec(file.model, 1);  // parsed fine just now
  return absl::StrFormat("wrote %s (%d parameters, versions [%s]) to %s in %.3f s",
                         model.ok() ? model->fingerprint : file.model, file.params.size(),
                         absl::StrJoin(file.versions, ","), out,
                         absl::ToDoubleSeconds(absl::Now() - start));
}

}  // namespace ps
