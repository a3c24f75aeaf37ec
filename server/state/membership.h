// Who takes part, as one shard sees it: the registered workers, when each was last heard from,
// whether it is inside its lease (active), its SSP clock and its own staleness histogram.
// A worker silent longer than the lease leaves the active set, so sync barriers and the SSP clock
// minimum never wait on a dead worker; hearing from it again brings it back.
// Not thread-safe: ParameterShard guards it with its mutex.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/time/time.h"
#include "server/state/staleness_histogram.h"

namespace ps {

// The clock leases are measured on: monotonic, so that a step of the wall clock (NTP) neither
// expires every worker at once nor keeps dead ones. Only differences of it mean anything.
absl::Time MonotonicNow();

class Membership {
 public:
  struct Worker {
    int64_t last_sequence = -1;  // last push sequence seen (applied or dropped)
    int64_t incarnation = 0;     // of the process that registered last; older ones are refused
    int64_t clock = 0;           // pushes completed; the SSP clock
    int64_t pushes_applied = 0;
    absl::Time last_seen;
    bool active = true;
    // Left the active set for making no progress while others waited for it: only a push or a
    // registration brings it back, not a heartbeat or a pull.
    bool stalled = false;
    absl::Time last_progress;  // when it joined or last pushed
    // The shard version when it last joined or came back after its lease expired: SSP drops its
    // gradients computed from before then, which the others were not held back for.
    int64_t joined_at_version = 0;
    StalenessHistogram staleness;
  };

  explicit Membership(absl::Duration lease) : lease_(lease) {}

  // Registers `id` or refreshes its lease (a registration or a push). A new worker, or one coming
  // back after it left the active set, joins at the slowest active clock (so that it does not hold
  // the others back) and records `version` as joined_at_version.
  Worker& Touch(int id, absl::Time now, int64_t version);
  // Refreshes a registered worker's lease (a heartbeat or a pull), bringing it back like Touch
  // unless it stalled. Returns false if `id` never registered.
  bool Refresh(int id, absl::Time now, int64_t version);
  // The worker's record, or null if it never registered.
  Worker* Find(int id);
  // Marks workers silent since before now - lease inactive; returns their ids.
  std::vector<int> Expire(absl::Time now);
  // Marks a worker that said it is leaving inactive at once. Returns false if it is unknown.
  bool Leave(int id);
  // Marks an active worker that made no progress while others waited for it inactive and stalled.
  void Stall(int id);

  int ActiveCount() const;
  // The slowest clock among active workers; INT64_MAX when none is active.
  int64_t MinActiveClock() const;
  const std::map<int, Worker>& workers() const { return workers_; }
  absl::Duration lease() const { return lease_; }

 private:
  absl::Duration lease_;
  std::map<int, Worker> workers_;
};

}  // namespace ps
