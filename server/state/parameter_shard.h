// One parameter-server shard: one contiguous range of the model's flat parameter vector. It
// composes the parts that hold its state, each in its own file:
//   ShardValues (shard_values.h)   the values and the optimizer's state;
//   Membership (membership.h)      the workers taking part: leases, push sequences, SSP clocks;
//   Round (round.h)                sync/local: the round being gathered, summed in rank order;
//   PullQueue (pull_queue.h)       pulls waiting to be admitted, until their deadlines;
// and decides, with its consistency policy (consistency.h), how each push is taken. Every change
// of that state, a primary's push or initialisation or a backup repeating its primary's change,
// goes through one Apply(ShardChange); Checkpoint and Restore read and seed it as one ShardState
// (shard_state.h). Knows nothing of gRPC.
// Thread-safe: all methods may be called concurrently. A pull is admitted under the shard's lock
// (briefly, but after any push being committed) and copies the values under their own lock
// (ShardValues): copies run side by side and never see a push half applied.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/state/buffer_pool.h"
#include "common/model_identity.h"
#include "common/partition.h"
#include "server/state/staleness_histogram.h"
#include "server/state/apply_threads.h"
#include "server/state/consistency.h"
#include "server/state/learning_rate.h"
#include "server/state/membership.h"
#include "server/state/norm_guard.h"
#include "server/state/optimizer.h"
#include "server/state/pull_queue.h"
#include "server/state/shard_state.h"
#include "server/state/shard_values.h"

namespace ps {

// One change of a shard's state, in the order the shard made it: the one way its state changes
// (ParameterShard::Apply). A primary decides it (policy, clipping, staleness, compensation) and
// streams it to its backup, whose ApplyChange repeats it and reaches the same state bit for bit
// (the update is replayed with the gradient as applied and the rate used, not recomputed).
struct ShardChange {
  enum class Kind {
    kInitialize,  // values: the initial values
    kUpdate,      // values: the gradient as applied (clipped, averaged, compensated)
    kTaken,       // a push taken without an update (dropped by policy): bookkeeping only
    // values: a worker's gradient added to the open round (sync, local; summed in rank order,
    // see round.h). Not counted, passed to the change listener or replicated: the round's update
    // is, when it closes.
    kJoinRound,
  };
  // kTaken: why the push was dropped.
  enum class Drop { kNone, kLate, kStale, kNorm };
  int64_t index = 0;  // the shard's change count after this change: 1, 2, 3, ...
  Kind kind = Kind::kUpdate;
  Drop drop = Drop::kNone;
  int64_t version = 0;  // the shard's version after it
  int worker_id = -1;   // whose push (kUpdate, kTaken); -1: none (a sync round)
  int64_t sequence = 0;
  int64_t clock = 0;  // the worker's SSP clock after it
  int64_t staleness = 0;
  float learning_rate = 0;
  absl::Span<const float> values = {};  // valid during the call it is passed to
  // kUpdate: `values` are exactly the push's gradient as it came in (not clipped or compensated),
  // whose slot was given this tag (PushSlot::set_forward_tag); 0: none, or values changed. The
  // shard only passes it on: replication names its forwarded pushes so (server/replication/).
  uint64_t forward_tag = 0;
};

struct ShardConfig {
  int shard_index = 0;
  int num_shards = 1;
  // The job's model (from ps --model) and worker count: the shard knows both before any client
  // speaks, so it sizes nothing on a request's word and takes worker ids in [0, num_workers) only.
  std::string model = "flat:1";
  int num_workers = 1;
  OptimizerConfig optimizer;
  LearningRateConfig learning_rate;
  std::string consistency = "async";         // see common/consistency_spec.h
  int backup_workers = 0;                    // rounds close after active - backup pushes
  absl::Duration lease = absl::Seconds(10);  // a worker silent this long leaves the active set
  // sync/ssp/local: a worker that others wait for (an open round without its push; the slowest
  // SSP clock) and that has not pushed for this long leaves the active set until it pushes or
  // registers again (heartbeats alone do not bring it back). Zero: off.
  absl::Duration progress_timeout = absl::Seconds(60);
  bool staleness_aware_lr = false;   // lr / max(1, staleness)
  int64_t max_staleness = -1;        // drop pushes staler than this; -1: off
  float dc_lambda = 0;               // DC-ASGD delay compensation; 0: off
  bool scale_lr_by_workers = false;  // lr * number of active workers
  // Scale each push's gradient (this shard's part of it) down to this L2 norm; 0: off.
  float clip_norm = 0;
  // Drop (and count) a push whose L2 norm is more than this many times the workers' reference
  // norm (NormGuard: one vote per worker); applied at once only (async, ssp, easgd: not to a sync
  // or local round's contributions, whose drop would hold the round). 0: off (ps
  // --max_norm_ratio: 1000).
  double max_norm_ratio = 0;
  // Scale a push's gradient down to this many times the same reference where it is above it
  // (counted as clipped), for the same pushes: one worker's pushes then weigh at most that much
  // more than the others', however large it makes them. 0: off (ps --clip_norm_ratio: 3).
  double clip_norm_ratio = 0;
  // Threads that apply one push together, each to its part of the range (ApplyThreads).
  int apply_threads = 1;
};

// The header of a push, checked before its payload is accepted. A push covers the shard's whole
// range: offset is the shard's begin and length its size.
struct PushHeaderInfo {
  int worker_id = 0;
  int64_t sequence = 0;
  int64_t base_version = 0;
  int64_t offset = 0;
  int64_t length = 0;
  int64_t incarnation = 0;  // from Registration
};

struct PushOutcome {
  int64_t version = 0;
  int64_t staleness = 0;
  bool duplicate = false;
  bool dropped = false;
  bool forward_tag_kept = false;  // the change carried the slot's tag (ShardChange::forward_tag)
};

struct Registration {
  int shard_index = 0;
  std::string consistency;
  bool initialized = false;
  Range range;
  int64_t version = 0;
  int64_t last_sequence = -1;
  int64_t incarnation = 0;  // workers: carried by their pushes, heartbeats and Leave
};

struct WorkerSnapshot {
  int worker_id = 0;
  bool active = false;
  int64_t clock = 0;
  int64_t pushes_applied = 0;
  double seconds_since_seen = 0;
  std::vector<int64_t> staleness_counts;
  int64_t incarnation = 0;
};

struct ShardStats {
  int shard_index = 0;
  int num_shards = 0;
  bool initialized = false;
  Range range;
  int64_t version = 0;
  int64_t pushes_applied = 0;
  int64_t pushes_rejected = 0;  // all rejections, the non-finite ones included
  int64_t pushes_duplicate = 0;
  int64_t pushes_dropped_late = 0;
  int64_t pushes_dropped_stale = 0;
  int64_t pushes_dropped_norm = 0;  // over --max_norm_ratio times the reference (NormGuard)
  // Updates refused because they would have made a weight or optimizer state non-finite (a push,
  // or under sync a whole round, which is then discarded).
  int64_t updates_nonfinite = 0;
  int64_t pushes_clipped = 0;  // gradients scaled down to --clip_norm or --clip_norm_ratio
  int64_t pulls = 0;
  int pulls_waiting = 0;  // held back right now
  int registered_workers = 0;
  int active_workers = 0;
  double learning_rate = 0;
  std::string model_fingerprint;
  std::string optimizer;
  std::string consistency;
  std::vector<int64_t> staleness_counts;
  // One page of the workers, by id from the one asked for; next_worker is where the next page
  // starts, -1 after the last.
  std::vector<WorkerSnapshot> workers;
  int next_worker = -1;
};

class ParameterShard {
 public:
  // How far a push's sequence may run ahead of the worker's last one: a restarted worker resumes
  // one past its lowest last sequence over the shards, so it is never more than a step ahead;
  // without a bound, one push of sequence INT64_MAX would make every later push a duplicate.
  static constexpr int64_t kMaxSequenceAhead = 1024;
  static constexpr int64_t kMaxResumeSequence = int64_t{1} << 62;
  // Largest shard accepted (4 GiB of float32).
  static constexpr int64_t kMaxShardElements = int64_t{1} << 30;
  // Idle push and pull buffers (kept so that a busy shard does not map fresh memory for each) are
  // freed after this long unused, so that a shard at rest holds its values and state, no more.
  static constexpr absl::Duration kBuffersUnused = absl::Seconds(5);
  // Most workers one Stats() page lists.
  static constexpr int kMaxStatsWorkers = 256;

  // Validates `config` (shard index, model, worker count, optimizer, schedule, policies); fails
  // naming the bad setting.
  static absl::StatusOr<std::unique_ptr<ParameterShard>> Create(const ShardConfig& config);

  // The model this shard serves, its index and its range of it.
  const ModelIdentity& model() const { return model_; }
  int index() const { return config_.shard_index; }
  const Range& range() const { return range_; }
  const ConsistencyPolicy& consistency() const { return *policy_; }

  // Called with each change (initialisation, every update, every push taken without one), under
  // the shard's lock: must be cheap (a copy of the values at most) and must not call the shard.
  // Not called for a sync round's contributions before it closes.
  using ChangeListener = std::function<void(const ShardChange&)>;
  // Calls `listener` with each change from now on (replacing any earlier one; null: none). The
  // owner sets it once the parts that listen (a checkpointer, a replica) exist.
  void SetChangeListener(ChangeListener listener);

  // Whether Initialize already succeeded (a restarted initialiser then need not send anything).
  bool initialized() const;
  // Updates applied so far.
  int64_t version() const;

  // An initialisation being received. Move-only; destroying it frees the shard's one
  // initialisation slot (see BeginInitialize).
  class InitializeSlot {
   public:
    InitializeSlot(InitializeSlot&& o) noexcept
        : shard_(std::exchange(o.shard_, nullptr)), values_(std::move(o.values_)) {}
    InitializeSlot& operator=(InitializeSlot&&) = delete;
    ~InitializeSlot();
    // Whether the shard still needs the values: false if it was initialised already (a restarted
    // initialiser), and then nothing need be received.
    bool needed() const { return !values_.empty(); }
    // Where the values go: the shard's size.
    absl::Span<float> values() { return absl::MakeSpan(values_); }

   private:
    friend class ParameterShard;
    explicit InitializeSlot(ParameterShard* shard) : shard_(shard) {}
    ParameterShard* shard_;  // holds the slot; null: none
    std::vector<float> values_;
  };
  // Checks an initialisation's header (the client's model must be the shard's and the range its
  // own) and, unless the shard is initialised already, takes the one initialisation slot, so
  // that clients cannot make the shard hold many shard-sized buffers: UNAVAILABLE while another
  // client holds it.
  absl::StatusOr<InitializeSlot> BeginInitialize(const ModelIdentity& model, int64_t offset,
                                                 int64_t length);
  // Sets the shard's values from `slot` once. Returns true if this call initialised the shard,
  // false if it was already initialised (nothing changes). Fails on a non-finite value.
  absl::StatusOr<bool> Commit(InitializeSlot slot);
  // BeginInitialize and Commit with `values` (tests and in-process callers).
  absl::StatusOr<bool> Initialize(const ModelIdentity& model, int64_t offset,
                                  absl::Span<const float> values);

  // Records that `worker_id` takes part (or is back), after checking it agrees on the model, and
  // hands the caller a new incarnation, which supersedes any earlier process of that id. A
  // negative id is an observer (e.g. the evaluator): checked, not recorded. Worker ids must lie in
  // [0, num_workers). A worker registering again after this shard restarted passes the sequence
  // of its next push as `resume_sequence` (at most kMaxResumeSequence; -1: none): the steps in
  // between were lost with the updates after the checkpoint, and its pushes go on from there.
  // Taken only by a shard that was restored, from a worker's first registration with it. Rounds
  // (sync, local) wait for all the job's workers to register first: the last to register may
  // close the open round (with backup workers, before it pushed).
  absl::StatusOr<Registration> Register(int worker_id, const ModelIdentity& model,
                                        int64_t resume_sequence = -1);
  // Refreshes a registered worker's lease; returns the number of active workers. Heartbeat, Leave
  // and Push fail with FAILED_PRECONDITION for a superseded incarnation.
  absl::StatusOr<int> Heartbeat(int worker_id, int64_t incarnation);
  // Takes a worker that is stopping out of the active set at once, rather than after its lease.
  absl::Status Leave(int worker_id, int64_t incarnation);
  // Drops from the active set the workers whose lease ran out at `now` (MonotonicNow()), or who
  // stalled (see ShardConfig::progress_timeout), and closes a sync round that was waiting only
  // for them. Returns their ids. Also frees the shard-sized buffers kept for pushes and pulls
  // that went unused for kBuffersUnused. The daemon calls this every second.
  std::vector<int> ExpireLeases(absl::Time now);

  // A push whose header passed every check, with a buffer of the shard's size (from the shard's
  // pool) for its gradient. Move-only. Commit applies it; destroyed uncommitted (a malformed
  // payload, a client gone), it counts as a rejected push.
  class PushSlot {
   public:
    PushSlot(PushSlot&& o) noexcept
        : shard_(std::exchange(o.shard_, nullptr)),
          header_(o.header_),
          buffer_(std::move(o.buffer_)),
          scan_(std::move(o.scan_)),
          forward_tag_(o.forward_tag_) {}
    PushSlot& operator=(PushSlot&&) = delete;
    ~PushSlot();
    absl::Span<float> gradient() { return buffer_.span(); }
    // A run of gradient()'s values, now in place (a payload source's ValuesSeen): scanned while
    // in the cache. Once every value was seen once, Commit scans no more. Runs of different
    // GradientScan blocks may be seen on different threads at once (GradientScan::Add).
    void Seen(absl::Span<const float> run) { scan_.Add(run); }
    // An opaque tag for the whole gradient as it came in (replication's: the push was forwarded
    // to the backup as it came), which the push's change carries if it applies exactly these
    // values (ShardChange::forward_tag); 0: none.
    void set_forward_tag(uint64_t tag) { forward_tag_ = tag; }

   private:
    friend class ParameterShard;
    PushSlot(ParameterShard* shard, const PushHeaderInfo& header, BufferPool::Lease buffer,
             bool squares)
        : shard_(shard),
          header_(header),
          buffer_(std::move(buffer)),
          scan_(buffer_.span(), squares) {}
    ParameterShard* shard_;  // null once committed or moved from
    PushHeaderInfo header_;
    BufferPool::Lease buffer_;
    GradientScan scan_;
    uint64_t forward_tag_ = 0;
  };
  // Checks a push's header before its payload is read (so no buffer is sized by a bad request):
  // worker, incarnation, sequence, base version, and a range that is the shard's whole range.
  // A refusal counts as a rejected push.
  absl::StatusOr<PushSlot> BeginPush(const PushHeaderInfo& header);
  // Takes the gradient in `slot` under the consistency model. A rejected push (an error) leaves
  // the shard's state exactly as it was, weights and optimizer state included: a non-finite
  // gradient, or one whose update would make a weight or state value non-finite, is rejected
  // (INVALID_ARGUMENT). A dropped one (outcome.dropped) is counted and not applied.
  absl::StatusOr<PushOutcome> Commit(PushSlot slot);
  // Counts a push rejected before it had a header to begin with (a malformed stream).
  void RecordRejectedPush();
  // BeginPush and Commit with `gradient` (tests and in-process callers).
  absl::StatusOr<PushOutcome> Push(const PushHeaderInfo& header, absl::Span<const float> gradient);

  using Snapshot = ShardValues::Snapshot;
  using ReadRequest = ps::ReadRequest;
  using ReadDone = ps::ReadDone;
  // A pull (ReadRequest). It waits until the shard is initialised and the consistency model admits
  // `worker_id` (observers, id < 0, never wait for it), or `deadline` passes: then ABORTED if
  // the consistency model holds it back (waiting longer is normal: a barrier, the SSP bound), or
  // UNAVAILABLE if the shard is still not initialised. A prefetching
  // worker pulls step s+1's weights before its push of step s (`after_sequence`; -1: none) has
  // landed: SSP admits it as if that push were done; rounds hold it until that push is in and its
  // round has closed.
  // Starts a pull without holding a thread while it waits. `done` is called exactly once, without
  // the shard's lock held, and must not block: from this call when the request is bad or can be
  // answered at once; later from the thread whose push, lease expiry, initialisation or shutdown
  // admits (or ends) it, from the PullQueue's deadline thread (ABORTED), or from CancelRead
  // (CANCELLED). Returns a ticket for CancelRead.
  int64_t StartRead(ReadRequest request, ReadDone done);
  // Ends a pull that is still waiting with CANCELLED; a no-op once it was answered.
  void CancelRead(int64_t ticket);
  // StartRead, waiting for the answer (tests and in-process callers).
  absl::StatusOr<Snapshot> Read(const ModelIdentity& model, int worker_id, int64_t offset,
                                int64_t length, absl::Time deadline, int64_t after_sequence = -1);

  // Counters and a page of at most `max_workers` (capped at kMaxStatsWorkers) workers with ids
  // >= first_worker.
  ShardStats Stats(int first_worker = 0, int max_workers = kMaxStatsWorkers) const;
  // Counters and every worker, page by page (for readers in this process: metrics, the final
  // statistics file). The pages are taken one after another, not at one instant.
  ShardStats AllStats() const;

  // Fills `out` with the shard's state now, copied under its lock (pushes wait for a copy of the
  // shard, no more). Reuses out's buffers: pass the same one each time and, after the first, the
  // copy goes into memory already mapped. Before initialisation: FAILED_PRECONDITION, and `out`
  // holds the header alone (no model: out->has_model() is false).
  absl::Status Checkpoint(ShardState* out) const;
  // Resumes from `state`, which must be of this shard (model, index, count, optimizer, a
  // consistency model whose pushes mean the same, sizes, known tensors; INVALID_ARGUMENT naming
  // what differs), hold a model and agree with itself (CheckStateInvariants; DATA_LOSS naming the
  // disagreement, as for a corrupt checkpoint). Workers come back active with a fresh lease: a
  // shard restarted within the lease loses none of them. Replaces whatever state the shard had (a
  // backup joining its primary again starts over from the primary's). Changes nothing when it
  // fails.
  absl::Status Restore(const ShardState& state);
  // A backup: repeats `change`, made by its primary, which must be the next one (its index one
  // past the shard's change count; FAILED_PRECONDITION otherwise, and on a change that does not
  // fit the shard's state). Calls the change listener like the primary did.
  absl::Status ApplyChange(const ShardChange& change);
  // OK if a client of `model` belongs here; FAILED_PRECONDITION naming what differs.
  absl::Status CheckModel(const ModelIdentity& model) const;
  // OK if `worker_id` is one of the job's workers; INVALID_ARGUMENT otherwise.
  absl::Status CheckWorkerId(int worker_id) const;
  // OK if `incarnation` is registered worker `worker_id`'s current process; FAILED_PRECONDITION
  // (not registered, or superseded) otherwise.
  absl::Status CheckCurrent(int worker_id, int64_t incarnation) const;
  // OK if a client's count of the job's workers (its --num_workers; 0: not given) is this
  // shard's; FAILED_PRECONDITION naming both otherwise.
  absl::Status CheckNumWorkers(int claimed) const;
  // Ends every waiting pull with UNAVAILABLE; later ones fail the same way.
  void Shutdown();
  ~ParameterShard();

 private:
  class Completions;

  ParameterShard(const ShardConfig& config, ModelIdentity model, LearningRateSchedule schedule,
                 std::unique_ptr<const ConsistencyPolicy> policy);

  absl::Status CheckPushHeader(const PushHeaderInfo& header) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // OK if `worker_id` registered and `incarnation` is its current one.
  absl::Status CheckIncarnation(int worker_id, int64_t incarnation) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status CheckRange(int64_t offset, int64_t length) const;
  // Whether worker_id's push of `after_sequence` has not landed yet (false for observers and
  // unknown workers).
  bool Pending(int worker_id, int64_t after_sequence) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // May worker_id's pull, made after its push of `after_sequence`, proceed now?
  bool Admits(int worker_id, int64_t after_sequence) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  ConsistencyState State() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return {members_, round_, version_};
  }
  float LearningRate() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Scales `gradient` down in place if its L2 norm (`norm`) is above clip_norm, or above
  // clip_norm_ratio times the norm guard's latest reference (pushes applied at once only); returns
  // whether it did.
  bool Clip(absl::Span<float> gradient, double norm) const;
  // The L2 norm of a push's trained values, from the whole push's `sum_of_squares` (0 when the
  // scan skipped squares: see NeedsSquares).
  double TrainedNorm(absl::Span<const float> gradient, double sum_of_squares) const;
  // Whether a push's scan needs the gradient's sum of squares (clipping, the norm guard).
  bool NeedsSquares() const {
    return config_.clip_norm > 0 || config_.clip_norm_ratio > 0 || config_.max_norm_ratio > 0;
  }
  // Decides how the push of `h` (whose gradient is `gradient`, with `norm`) is taken: the change
  // to apply, or an error that rejects it.
  absl::StatusOr<ShardChange> Decide(const PushHeaderInfo& h, absl::Span<const float> gradient,
                                     double norm) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DC-ASGD: the gradient compensated for the weights' moves since worker's pull of
  // base_version, in scratch_; `gradient` itself if the shard kept no copy of those weights.
  absl::Span<const float> Compensate(int worker_id, int64_t base_version,
                                     absl::Span<const float> gradient)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The one way the shard's state changes: applies `change` (the values, the version, the
  // worker's bookkeeping, the round, the counters), then counts it (its index and version) and
  // passes it to the change listener, but for kJoinRound. `max_abs` bounds an update's gradient
  // (see Optimizer::Apply). All or nothing: an error (a value that would become non-finite) changes
  // nothing.
  absl::Status Apply(ShardChange change, float max_abs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rounds: applies the round's average once the consistency model has all it waits for (all
  // the job's workers registered, the pushes of the active ones but backups in); logs once if
  // the job's first round waits for workers to register.
  void MaybeCloseRound() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets what the shard kept for a worker that left the active set (DC-ASGD copies).
  void Forget(int worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers `request` now if it can be (admitted, shut down, or past its deadline at `now`):
  // adds its answer to `out` (an admitted pull's values are copied once the lock is released)
  // and returns true.
  bool TryAnswer(const ReadRequest& request, absl::Time now, const ReadDone& done, Completions* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers every waiting pull that can be answered now. Called after each change of state, and
  // by the PullQueue when a deadline passed.
  void AnswerWaiters(Completions* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AnswerExpired() ABSL_LOCKS_EXCLUDED(mu_);
  // DC-ASGD: keeps a copy of what an active worker pulled (copied outside the lock).
  void KeepPulledCopy(int worker_id, const Snapshot& snapshot) ABSL_LOCKS_EXCLUDED(mu_);

  const ShardConfig config_;
  const ModelIdentity model_;
  const Range range_;
  // How many of the range's values are trained: the rest are the layout's buffers, which pushes
  // set and which neither clipping, the norm guard nor DC-ASGD touch.
  const int64_t trained_;
  const LearningRateSchedule schedule_;
  const std::unique_ptr<const ConsistencyPolicy> policy_;

  // Lock order: mu_, then the values' and the pull queue's own. mu_ guards the bookkeeping and
  // serialises every change of the values.
  mutable absl::Mutex mu_;
  bool initialized_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  bool initializing_ ABSL_GUARDED_BY(mu_) = false;
  ChangeListener on_change_ ABSL_GUARDED_BY(mu_);
  ShardValues values_;
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t changes_ ABSL_GUARDED_BY(mu_) = 0;  // ShardChange::index of the last change
  Membership members_ ABSL_GUARDED_BY(mu_);
  Round round_ ABSL_GUARDED_BY(mu_);  // sync, local: the open round
  bool logged_registration_wait_ ABSL_GUARDED_BY(mu_) = false;
  NormGuard norm_guard_ ABSL_GUARDED_BY(mu_);
  // norm_guard_.reference() as of the last push applied, for Clip outside the lock.
  std::atomic<double> norm_reference_{0};
  StalenessHistogram staleness_ ABSL_GUARDED_BY(mu_);
  // DC-ASGD: each active worker's copies of the weights at its last two whole-shard pulls (a
  // prefetching worker computes on the older one), by version: at most 2 * num_workers copies.
  std::map<int, std::map<int64_t, std::vector<float>>> pulled_weights_ ABSL_GUARDED_BY(mu_);
  std::vector<float> scratch_ ABSL_GUARDED_BY(mu_);  // DC-ASGD's compensated gradient
  int64_t pushes_rejected_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pushes_duplicate_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pushes_dropped_late_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pushes_dropped_stale_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pushes_dropped_norm_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t updates_nonfinite_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pushes_clipped_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pulls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  bool restored_ ABSL_GUARDED_BY(mu_) = false;     // Restore() succeeded
  std::set<int> registered_ ABSL_GUARDED_BY(mu_);  // worker ids registered with this object
  BufferPool push_buffers_{2};                     // gradients being received; two idle ones kept
  PullQueue pulls_waiting_;                        // last: its thread calls back into the shard
};

}  // namespace ps
