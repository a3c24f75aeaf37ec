#include "worker/shard_stats.h"

#include "absl/strings/str_cat.h"

namespace ps {

absl::StatusOr<std::vector<v1::StatsResponse>> FetchStats(ShardedClient& client) {
  std::vector<v1::StatsResponse> stats;
  std::vector<int> last;  // by shard: the highest worker id taken so far
  // One request serves every shard; shards know different workers, so a page goes on from the
  // lowest id where some shard's page ended, and each shard's workers already taken are skipped.
  for (int first = 0; first >= 0;) {
    v1::StatsRequest request;
    request.set_first_worker(first);
    absl::StatusOr<std::vector<std::string>> answers =
        client.CallEachShard("/ps.v1.ParameterServer/GetStats", request.SerializeAsString());
    if (!answers.ok()) return answers.status();
    if (stats.empty()) {
      stats.resize(answers->size());
      last.assign(answers->size(), -1);
    }
    int next = -1;
    for (size_t shard = 0; shard < stats.size(); ++shard) {
      v1::StatsResponse page;
      if (!page.ParseFromString((*answers)[shard])) {
        return absl::DataLossError(absl::StrCat("shard ", shard, "'s statistics do not parse"));
      }
      if (first == 0) {
        stats[shard] = page;
        stats[shard].clear_workers();
      }
      for (const v1::WorkerStats& w : page.workers()) {
        if (w.worker_id() <= last[shard]) continue;
        *stats[shard].add_workers() = w;
        last[shard] = w.worker_id();
      }
      if (page.next_worker() > first && (next < 0 || page.next_worker() < next)) {
        next = page.next_worker();
      }
    }
    first = next;
  }
  for (v1::StatsResponse& s : stats) s.set_next_worker(-1);
  return stats;
}

}  // namespace ps
