// The job as a table (psctl status): one row per shard process (address, replica role, version,
// updates/s, workers active/registered, staleness p50/p99, pushes dropped and rejected); the build
// the processes run (their --version line; one per process under a warning when they differ); a
// line per shard whose checkpoints failed (how many, the last error, the newest written); and one
// row per worker (its clock, seconds since last seen, pushes), from two rounds of the shards'
// statistics.
#pragma once

#include <string>
#include <vector>

#include "proto/ps.pb.h"

namespace ps {

// The staleness below which `fraction` of the applied pushes fall (from staleness_counts); -1
// when none was applied.
int64_t StalenessQuantile(const v1::StatsResponse& stats, double fraction);

// `now` and `before` by shard process (a replicated shard has a row per replica; a row whose
// replica_role is "down" did not answer), `seconds` apart (rates are "-" without `before`). The
// workers come from the first unreplicated shard or primary (every shard sees every worker).
std::string StatusTable(const std::vector<std::string>& addresses,
                        const std::vector<v1::StatsResponse>& now,
                        const std::vector<v1::StatsResponse>* before, double seconds);

}  // namespace ps
