// The consistency models' rules on a shard, one small class each behind ConsistencyPolicy: how a
// push is taken (applied at once, gathered into a round, dropped), whether a pull may proceed,
// whom the other workers wait for, and what a pushed vector is (a gradient for the optimizer, or
// a change added to the weights as it is). See common/consistency_spec.h for the models.
// Staleness = shard version at apply minus the version the push was computed from.
//   async:  every push applied at once; staleness unbounded.
//   sync:   the gradients of all active workers (less backup workers) for version v are summed
//           in rank order (round.h: the same bits run to run), averaged and applied once,
//           v -> v+1; late ones are dropped. No round closes before all num_workers workers have
//           registered (a worker that starts first does not train alone). Every applied gradient
//           has staleness 0.
//   ssp:s:  pushes applied at once; a worker whose clock (pushes done) is c may pull only when the
//           slowest active worker's clock is >= c - s. Staleness <= (W-1)(2s+1) for W active
//           workers.
//   easgd:  each push is a worker's elastic difference alpha*(x_i - centre), added to the centre
//           at once (the centre's side of the exchange, atomic under the shard's lock).
//   local:  each push is a worker's change over its H local steps; a round (as under sync) adds
//           their average to the weights: the average of the workers' models.
// Policies hold no state of their own: the shard passes its state (ConsistencyState) to each
// call, under its lock. Immutable, so thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/consistency_spec.h"
#include "server/state/membership.h"
#include "server/state/round.h"

namespace ps {

// What a policy sees of its shard.
struct ConsistencyState {
  const Membership& members;
  const Round& round;
  int64_t version = 0;
};

// A push that passed the shard's own checks (worker, incarnation, not a duplicate).
struct PushInfo {
  int worker_id = 0;
  int64_t sequence = 0;  // > the worker's last
  int64_t base_version = 0;
};

class ConsistencyPolicy {
 public:
  enum class Take { kApply, kJoinRound, kDropLate };

  // Makes the policy of `spec` for a job of `num_workers` (an easgd spec without alpha gets
  // 0.9 / num_workers; rounds wait for all of them to register) that closes rounds without its
  // last `backup_workers` pushes.
  static std::unique_ptr<ConsistencyPolicy> Make(ConsistencySpec spec, int num_workers,
                                                 int backup_workers);
  virtual ~ConsistencyPolicy() = default;

  const ConsistencySpec& spec() const { return spec_; }
  // The canonical text, e.g. "ssp:3" (what Registration tells the clients).
  std::string Name() const { return ConsistencyText(spec_); }

  // How the shard takes `push` from `worker`; an error rejects it and changes nothing.
  virtual absl::StatusOr<Take> OnPush(const ConsistencyState& s, const Membership::Worker& worker,
                                      const PushInfo& push) const = 0;
  // Whether `worker_id`'s pull may proceed; `ahead`: it is made before its last push landed
  // (a prefetch), which SSP counts as done and rounds wait for.
  virtual bool Admits(const ConsistencyState& s, int worker_id, const Membership::Worker& worker,
                      bool ahead) const = 0;
  // The active workers the others are waiting for now (the progress timeout expires them).
  virtual std::vector<int> WaitedFor(const ConsistencyState&) const { return {}; }
  // Rounds: how many of the job's workers have never registered; no round closes before all did.
  virtual int Unregistered(const ConsistencyState&) const { return 0; }
  // Rounds: whether the open round has all the pushes it waits for.
  virtual bool RoundComplete(const ConsistencyState&) const { return false; }

 protected:
  explicit ConsistencyPolicy(ConsistencySpec spec) : spec_(spec) {}

 private:
  const ConsistencySpec spec_;
};

}  // namespace ps
