// Deaths to inject into a local run (launch --kill): "worker:2@300steps,ps:1@800u" kills worker 2
// once the workers have done 300 steps and shard 1 once 800 updates were applied (SIGKILL, as a
// crash would), to watch the run recover. A death triggered by progress lands at the same point
// of the run on a fast machine and a slow one; one triggered by time ("@20s") does not.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ps {

// How far a run has got, as the launcher sees it.
struct RunProgress {
  double seconds = 0;   // since the run's start
  int64_t steps = 0;    // worker steps, summed over workers (their CSVs)
  int64_t updates = 0;  // updates applied (shard versions), summed over shards
};

struct Kill {
  enum class Role { kWorker, kShard };
  // What `at` counts: seconds since the start, worker steps or applied updates (RunProgress).
  enum class Unit { kSeconds, kSteps, kUpdates };
  Role role = Role::kWorker;
  int index = 0;  // worker rank or shard index
  Unit unit = Unit::kSeconds;
  double at = 0;

  std::string Name() const;  // "worker 2", "shard 1"
  std::string When() const;  // "at 20 s", "after 300 steps", "after 800 updates"
  bool Due(const RunProgress& progress) const;
};

// Parses ROLE:INDEX@WHEN items separated by commas. ROLE: worker or ps. WHEN: a number with a unit:
// "s" (seconds since the start; the default), "steps" (worker steps, summed over workers) or "u" /
// "updates" (applied updates, summed over shards). Indices are checked against the cluster's size.
// Kept in the order given; each fires once, when it is due.
absl::StatusOr<std::vector<Kill>> ParseKillPlan(const std::string& text, int shards, int workers);

}  // namespace ps
