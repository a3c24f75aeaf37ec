// Deaths to inject into a local run (launch --kill): "worker:2@20s,ps:1@40s" kills worker 2 at
// 20 s and shard 1 at 40 s (SIGKILL, as a crash would), to watch the run recover.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ps {

struct Kill {
  enum class Role { kWorker, kShard };
  Role role = Role::kWorker;
  int index = 0;         // worker rank or shard index
  absl::Duration at;     // after the run's start
  std::string Name() const;  // "worker 2", "shard 1"
};

// Parses ROLE:INDEX@SECONDSs items separated by commas (ROLE: worker or ps; the trailing "s" is
// optional), checking indices against the cluster's size. Sorted by time.
absl::StatusOr<std::vector<Kill>> ParseKillPlan(const std::string& text, int shards, int workers);

}  // namespace ps
