#include "server/state/consistency.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

// async and easgd: every push applied at once, every pull admitted.
class AsyncPolicy : public ConsistencyPolicy {
 public:
  explicit AsyncPolicy(ConsistencySpec spec) : ConsistencyPolicy(spec) {}
  absl::StatusOr<Take> OnPush(const ConsistencyState&, const Membership::Worker&,
                              const PushInfo&) const override {
    return Take::kApply;
  }
  bool Admits(const ConsistencyState&, int, const Membership::Worker&, bool) const override {
    return true;
  }
};

// ssp:S: pushes applied at once; pulls held within S clocks of the slowest active worker.
class SspPolicy : public ConsistencyPolicy {
 public:
  explicit SspPolicy(ConsistencySpec spec) : ConsistencyPolicy(spec) {}
  absl::StatusOr<Take> OnPush(const ConsistencyState&, const Membership::Worker& worker,
                              const PushInfo& push) const override {
    // Computed before it left the active set: the others were not held back for it, so applying
    // it could break the staleness bound.
    if (push.base_version < worker.joined_at_version || !worker.active) return Take::kDropLate;
    return Take::kApply;
  }
  bool Admits(const ConsistencyState& s, int, const Membership::Worker& worker,
              bool ahead) const override {
    return worker.clock + ahead - spec().staleness_bound <= s.members.MinActiveClock();
  }
  // The slowest, when some worker is (or, prefetching, may be) held back by it.
  std::vector<int> WaitedFor(const ConsistencyState& s) const override {
    const int64_t slowest = s.members.MinActiveClock();
    bool someone_held = false;
    for (const auto& [id, w] : s.members.workers()) {
      someone_held |=
          w.active && w.clock > slowest && w.clock + 1 - spec().staleness_bound > slowest;
    }
    std::vector<int> ids;
    for (const auto& [id, w] : s.members.workers()) {
      if (someone_held && w.active && w.clock == slowest) ids.push_back(id);
    }
    return ids;
  }
};

// sync and local: the pushes for version v gather in a round that closes (v -> v+1) once all
// `num_workers` have registered and every active worker but `backup_workers` has pushed; a worker
// pulls again when its round closed.
class RoundPolicy : public ConsistencyPolicy {
 public:
  RoundPolicy(ConsistencySpec spec, int num_workers, int backup_workers)
      : ConsistencyPolicy(spec), num_workers_(num_workers), backup_workers_(backup_workers) {}
  absl::StatusOr<Take> OnPush(const ConsistencyState& s, const Membership::Worker&,
                              const PushInfo& push) const override {
    const bool current = push.base_version == s.version;
    // After a restart of the shard: the open round was restored with this worker's push in it,
    // and the worker (which registered again) now sends its next step for the same round.
    // Dropped as late, like a push whose round closed without it; its next pull waits for the
    // round as usual.
    if (current && s.round.restored().count(push.worker_id) > 0) return Take::kDropLate;
    if (current && s.round.contributors().count(push.worker_id) > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", push.worker_id, " already pushed for version ", s.version));
    }
    // Its round closed without it (backup workers, or it was expired).
    if (!current) return Take::kDropLate;
    return Take::kJoinRound;
  }
  // A pull ahead of the worker's push (a prefetch) waits for that push and then for its round to
  // close: the next round's weights do not exist before.
  bool Admits(const ConsistencyState& s, int worker_id, const Membership::Worker&,
              bool ahead) const override {
    return !ahead && s.round.contributors().count(worker_id) == 0;
  }
  // The workers missing from an open round.
  std::vector<int> WaitedFor(const ConsistencyState& s) const override {
    std::vector<int> ids;
    if (!s.round.open()) return ids;
    for (const auto& [id, w] : s.members.workers()) {
      if (w.active && s.round.contributors().count(id) == 0) ids.push_back(id);
    }
    return ids;
  }
  // Membership keeps every worker that ever registered, and a shard restored from a checkpoint
  // gets the workers it had back: only the job's first rounds wait. Backup workers do not lower
  // the count: they let a round close without the slowest pushes of the workers taking part, and
  // a worker that has not started is not a slow one (rounds closed without it would lack its
  // data, and how many did would differ from run to run).
  int Unregistered(const ConsistencyState& s) const override {
    return std::max(0, num_workers_ - static_cast<int>(s.members.workers().size()));
  }
  // Complete once all workers registered and all active workers but the backups have pushed. The
  // pushes of workers that left or expired since stay in the round but stand in for no one: a
  // worker finishing its last step and leaving must not close a round the others have not pushed
  // to yet.
  bool RoundComplete(const ConsistencyState& s) const override {
    if (!s.round.open() || Unregistered(s) > 0) return false;
    int active_contributors = 0;
    for (const auto& [id, w] : s.members.workers()) {
      active_contributors += w.active && s.round.contributors().count(id) > 0;
    }
    return active_contributors >= std::max(1, s.members.ActiveCount() - backup_workers_);
  }

 private:
  const int num_workers_;
  const int backup_workers_;
};

}  // namespace

std::unique_ptr<ConsistencyPolicy> ConsistencyPolicy::Make(ConsistencySpec spec, int num_workers,
                                                           int backup_workers) {
  using Kind = ConsistencySpec::Kind;
  switch (spec.kind) {
    case Kind::kSync:
    case Kind::kLocalSgd:
      return std::make_unique<RoundPolicy>(spec, num_workers, backup_workers);
    case Kind::kSsp:
      return std::make_unique<SspPolicy>(spec);
    case Kind::kEasgd:
      if (spec.alpha <= 0) spec.alpha = 0.9 / std::max(1, num_workers);
      return std::make_unique<AsyncPolicy>(spec);
    case Kind::kAsync:
      break;
  }
  return std::make_unique<AsyncPolicy>(spec);
}

}  // namespace ps
