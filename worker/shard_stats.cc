#include "worker/shard_stats.h"

#include "absl/strings/str_cat.h"

namespace ps {

absl::StatusOr<std::vector<v1::StatsResponse>> FetchStats(ShardedClient& client) {
  absl::StatusOr<std::vector<std::string>> answers = client.CallEachShard(
      "/ps.v1.ParameterServer/GetStats", v1::StatsRequest().SerializeAsString());
  if (!answers.ok()) return answers.status();
  std::vector<v1::StatsResponse> stats(answers->size());
  for (size_t shard = 0; shard < stats.size(); ++shard) {
    if (!stats[shard].ParseFromString((*answers)[shard])) {
      return absl::DataLossError(absl::StrCat("shard ", shard, "'s statistics do not parse"));
    }
  }
  return stats;
}

}  // namespace ps
