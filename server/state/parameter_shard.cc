#include "server/state/parameter_shard.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/log.h"
#include "common/model_spec.h"
#include "server/state/parameter_shard_completions.h"

namespace ps {
namespace {

std::string RangeText(int64_t lo, int64_t hi) { return absl::StrCat("[", lo, ", ", hi, ")"); }

// offset + length for messages, without signed overflow on hostile values.
int64_t End(int64_t offset, int64_t length) {
  return static_cast<int64_t>(
      std::clamp<__int128>(static_cast<__int128>(offset) + length, INT64_MIN, INT64_MAX));
}

// Returns the index of the first NaN or infinity, or -1.
int64_t FirstNonFinite(absl::Span<const float> v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ParameterShard>> ParameterShard::Create(const ShardConfig& c) {
  if (c.num_shards < 1 || c.shard_index < 0 || c.shard_index >= c.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shard_index=", c.shard_index, " must be in [0, --num_shards=", c.num_shards, ")"));
  }
  absl::StatusOr<ModelIdentity> model = ParseModelSpec(c.model, c.num_shards);
  if (!model.ok()) return model.status();
  Range r = PartRange(model->total_params, c.shard_index, c.num_shards);
  if (r.size() > kMaxShardElements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard would hold ", r.size(), " parameters, above the limit of ", kMaxShardElements));
  }
  if (r.size() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("model ", c.model, " has fewer parameters (",
                                                   model->total_params, ") than shards"));
  }
  if (c.num_workers < 1) return absl::InvalidArgumentError("--num_workers must be >= 1");
  if (absl::StatusOr<std::unique_ptr<Optimizer>> o = MakeOptimizer(c.optimizer, 0); !o.ok()) {
    return o.status();
  }
  absl::StatusOr<LearningRateSchedule> schedule = LearningRateSchedule::Create(c.learning_rate);
  if (!schedule.ok()) return schedule.status();
  if (c.backup_workers < 0) return absl::InvalidArgumentError("--backup_workers must be >= 0");
  absl::StatusOr<ConsistencySpec> consistency = ParseConsistencySpec(c.consistency);
  if (!consistency.ok()) return consistency.status();
  if (consistency->local_models() &&
      (c.dc_lambda > 0 || c.staleness_aware_lr || c.max_staleness >= 0)) {
    // A worker moves its own model by what it pushes: a change the shard dropped would be lost.
    return absl::InvalidArgumentError(absl::StrCat(
        "--dc_lambda, --staleness_lr and --max_staleness act on gradients; under --consistency=",
        c.consistency, " workers push changes of their models"));
  }
  if (c.lease <= absl::ZeroDuration()) return absl::InvalidArgumentError("the lease must be > 0");
  if (c.progress_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the progress timeout must be >= 0");
  }
  if (!(c.dc_lambda >= 0) || !std::isfinite(c.dc_lambda)) {
    return absl::InvalidArgumentError("--dc_lambda must be a number >= 0");
  }
  if (!(c.clip_norm >= 0) || !std::isfinite(c.clip_norm)) {
    return absl::InvalidArgumentError("--clip_norm must be a number >= 0");
  }
  if (!(c.max_norm_ratio == 0 || c.max_norm_ratio >= 1) || !std::isfinite(c.max_norm_ratio)) {
    return absl::InvalidArgumentError("--max_norm_ratio must be 0 (off) or a number >= 1");
  }
  if (!(c.clip_norm_ratio == 0 || c.clip_norm_ratio >= 1) || !std::isfinite(c.clip_norm_ratio)) {
    return absl::InvalidArgumentError("--clip_norm_ratio must be 0 (off) or a number >= 1");
  }
  if (c.apply_threads < 1 || c.apply_threads > ApplyThreads::kMaxThreads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--apply_threads must be in [1, ", ApplyThreads::kMaxThreads, "] (0: automatic)"));
  }
  return std::unique_ptr<ParameterShard>(
      new ParameterShard(c, *std::move(model), *std::move(schedule),
                         ConsistencyPolicy::Make(*consistency, c.num_workers, c.backup_workers)));
}

ParameterShard::ParameterShard(const ShardConfig& config, ModelIdentity model,
                               LearningRateSchedule schedule,
                               std::unique_ptr<const ConsistencyPolicy> policy)
    : config_(config),
      model_(std::move(model)),
      range_(PartRange(model_.total_params, config.shard_index, config.num_shards)),
      trained_(std::clamp(model_.total_params - model_.buffer_values - range_.begin, int64_t{0},
                          range_.size())),
      schedule_(std::move(schedule)),
      policy_(std::move(policy)),
      values_(range_, trained_, config.optimizer, policy_->spec().local_models(),
              config.apply_threads),
      members_(config.lease),
      round_(range_.size(), config.num_workers),
      norm_guard_(config.max_norm_ratio),
      pulls_waiting_([this] { AnswerExpired(); }) {}

ParameterShard::~ParameterShard() {
  Shutdown();
  pulls_waiting_.Stop();
}


absl::Status ParameterShard::CheckModel(const ModelIdentity& m) const {
  if (m.num_shards != config_.num_shards) {
    return absl::FailedPreconditionError(absl::StrCat(
        "client expects ", m.num_shards, " shards, this cluster has ", config_.num_shards));
  }
  if (m.fingerprint != model_.fingerprint || m.total_params != model_.total_params) {
    // The client's fingerprint is echoed at most 100 characters long: an error message must not
    // grow past gRPC's metadata limits on a client's word.
    return absl::FailedPreconditionError(
        absl::StrCat("model mismatch: shard holds ", model_.fingerprint, " (", model_.total_params,
                     " parameters), client has ", m.fingerprint.substr(0, 100),
                     m.fingerprint.size() > 100 ? "..." : "", " (", m.total_params, ")"));
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::CheckWorkerId(int worker_id) const {
  if (worker_id < 0 || worker_id >= config_.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("worker id ", worker_id,
                                                   " is outside this job's [0, ",
                                                   config_.num_workers, ") (ps --num_workers)"));
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::CheckNumWorkers(int claimed) const {
  if (claimed == 0 || claimed == config_.num_workers) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "worker count mismatch: shard ", config_.shard_index, " serves a job of ",
      config_.num_workers, " workers (ps --num_workers=", config_.num_workers,
      "), this worker was started with --num_workers=", claimed,
      ": give every shard and worker the same count (each worker's share of the data depends on "
      "it)"));
}

void ParameterShard::SetChangeListener(ChangeListener listener) {
  absl::MutexLock lock(&mu_);
  on_change_ = std::move(listener);
}

bool ParameterShard::initialized() const {
  absl::ReaderMutexLock lock(&mu_);
  return initialized_;
}

int64_t ParameterShard::version() const {
  absl::ReaderMutexLock lock(&mu_);
  return version_;
}

ParameterShard::InitializeSlot::~InitializeSlot() {
  if (shard_ == nullptr) return;
  absl::MutexLock lock(&shard_->mu_);
  shard_->initializing_ = false;
}

absl::StatusOr<ParameterShard::InitializeSlot> ParameterShard::BeginInitialize(
    const ModelIdentity& model, int64_t offset, int64_t length) {
  if (absl::Status s = CheckModel(model); !s.ok()) return s;
  if (offset != range_.begin || length != range_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("initialisation covers ", RangeText(offset, End(offset, length)), ", shard ",
                     config_.shard_index, " owns ", RangeText(range_.begin, range_.end)));
  }
  {
    absl::MutexLock lock(&mu_);
    if (initialized_) return InitializeSlot(nullptr);
    if (initializing_) return absl::UnavailableError("another initialisation is in progress");
    initializing_ = true;
  }
  InitializeSlot slot(this);  // frees the initialisation slot again if the buffer cannot be had
  slot.values_.resize(range_.size());
  return slot;
}

absl::StatusOr<bool> ParameterShard::Commit(InitializeSlot slot) {
  if (!slot.needed()) return false;
  if (int64_t bad = FirstNonFinite(slot.values_); bad >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial value at offset ", range_.begin + bad, " is not finite"));
  }
  Completions answers(this);
  absl::MutexLock lock(&mu_);
  if (initialized_) return false;  // restored meanwhile (a backup)
  const float unbounded = std::numeric_limits<float>::infinity();
  if (absl::Status s =
          Apply({.kind = ShardChange::Kind::kInitialize, .values = slot.values_}, unbounded);
      !s.ok()) {
    return s;
  }
  AnswerWaiters(&answers);
  return true;
}

absl::StatusOr<bool> ParameterShard::Initialize(const ModelIdentity& model, int64_t offset,
                                                absl::Span<const float> values) {
  absl::StatusOr<InitializeSlot> slot = BeginInitialize(model, offset, values.size());
  if (!slot.ok()) return slot.status();
  if (!slot->needed()) return false;
  std::copy(values.begin(), values.end(), slot->values().begin());
  return Commit(*std::move(slot));
}

absl::StatusOr<Registration> ParameterShard::Register(int worker_id, const ModelIdentity& model,
                                                      int64_t resume_sequence) {
  if (absl::Status s = CheckModel(model); !s.ok()) return s;
  if (worker_id >= 0) {
    if (absl::Status s = CheckWorkerId(worker_id); !s.ok()) return s;
  }
  if (resume_sequence < -1 || resume_sequence > kMaxResumeSequence) {
    return absl::InvalidArgumentError(
        absl::StrCat("resume_sequence ", resume_sequence, " is outside [0, 2^62]"));
  }
  Completions answers(this);
  absl::MutexLock lock(&mu_);
  Registration r{config_.shard_index, policy_->Name(), initialized_, range_, version_};
  if (worker_id >= 0) {
    Membership::Worker& w = members_.Touch(worker_id, MonotonicNow(), version_);
    // Increasing across restarts of the shard too (checkpoints keep the workers' incarnations).
    last_incarnation_ = std::max(last_incarnation_ + 1, absl::ToUnixMicros(absl::Now()));
    w.incarnation = last_incarnation_;
    // The steps between this shard's checkpoint and the worker's position were lost with the
    // shard's updates: the worker goes on from where it is. Only once per worker, and only on a
    // shard that resumed from a checkpoint.
    if (resume_sequence >= 0 && restored_ && registered_.insert(worker_id).second) {
      w.last_sequence = std::max(w.last_sequence, resume_sequence - 1);
    }
    registered_.insert(worker_id);
    r.last_sequence = w.last_sequence;
    r.incarnation = w.incarnation;
    MaybeCloseRound();  // with backup workers, a round may have waited only for this one
  }
  AnswerWaiters(&answers);
  return r;
}

absl::Status ParameterShard::CheckIncarnation(int worker_id, int64_t incarnation) const {
  auto it = members_.workers().find(worker_id);
  if (it == members_.workers().end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker_id, " has not registered with shard ", config_.shard_index));
  }
  if (it->second.incarnation != incarnation) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker_id, " (incarnation ", incarnation,
                     ") was superseded by a newer process with the same rank (incarnation ",
                     it->second.incarnation, ") at shard ", config_.shard_index));
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::CheckCurrent(int worker_id, int64_t incarnation) const {
  absl::ReaderMutexLock lock(&mu_);
  return CheckIncarnation(worker_id, incarnation);
}

absl::StatusOr<int> ParameterShard::Heartbeat(int worker_id, int64_t incarnation) {
  if (absl::Status s = CheckWorkerId(worker_id); !s.ok()) return s;
  Completions answers(this);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckIncarnation(worker_id, incarnation); !s.ok()) return s;
  members_.Refresh(worker_id, MonotonicNow(), version_);
  AnswerWaiters(&answers);
  return members_.ActiveCount();
}

absl::Status ParameterShard::Leave(int worker_id, int64_t incarnation) {
  if (absl::Status s = CheckWorkerId(worker_id); !s.ok()) return s;
  Completions answers(this);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckIncarnation(worker_id, incarnation); !s.ok()) return s;
  members_.Leave(worker_id);
  Forget(worker_id);
  MaybeCloseRound();  // a round may have been waiting only for it
  AnswerWaiters(&answers);
  return absl::OkStatus();
}

std::vector<int> ParameterShard::ExpireLeases(absl::Time now) {
  push_buffers_.Trim(kBuffersUnused);
  values_.Trim(kBuffersUnused);
  Completions answers(this);
  absl::MutexLock lock(&mu_);
  round_.Trim(kBuffersUnused);
  std::vector<int> expired = members_.Expire(now);
  if (config_.progress_timeout > absl::ZeroDuration()) {
    std::vector<int> stalled;
    for (int id : policy_->WaitedFor(State())) {
      if (now - members_.workers().at(id).last_progress > config_.progress_timeout) {
        stalled.push_back(id);
      }
    }
    for (int id : stalled) members_.Stall(id);
    expired.insert(expired.end(), stalled.begin(), stalled.end());
  }
  for (int id : expired) Forget(id);
  if (!expired.empty()) {
    MaybeCloseRound();
    AnswerWaiters(&answers);
  }
  return expired;
}

void ParameterShard::Forget(int worker_id) { pulled_weights_.erase(worker_id); }

absl::Status ParameterShard::CheckRange(int64_t offset, int64_t length) const {
  if (length <= 0 || offset < range_.begin || offset > range_.end - length) {
    return absl::InvalidArgumentError(absl::StrCat("range ", RangeText(offset, End(offset, length)),
                                                   " is not inside shard ", config_.shard_index,
                                                   "'s ", RangeText(range_.begin, range_.end)));
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::CheckPushHeader(const PushHeaderInfo& h) const {
  if (absl::Status s = CheckWorkerId(h.worker_id); !s.ok()) return s;
  if (h.sequence < 0) {
    return absl::InvalidArgumentError(absl::StrCat("push sequence ", h.sequence, " is negative"));
  }
  if (h.offset != range_.begin || h.length != range_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push covers ", RangeText(h.offset, End(h.offset, h.length)), "; a push must cover shard ",
        config_.shard_index, "'s whole range ", RangeText(range_.begin, range_.end)));
  }
  if (!initialized_) return absl::FailedPreconditionError("shard is not initialised yet");
  if (absl::Status s = CheckIncarnation(h.worker_id, h.incarnation); !s.ok()) return s;
  if (int64_t last = members_.workers().at(h.worker_id).last_sequence;
      h.sequence > last + kMaxSequenceAhead) {
    return absl::InvalidArgumentError(absl::StrCat("push sequence ", h.sequence, " is more than ",
                                                   kMaxSequenceAhead, " ahead of worker ",
                                                   h.worker_id, "'s last (", last, ")"));
  }
  if (h.base_version < 0 || h.base_version > version_) {
    return absl::InvalidArgumentError(absl::StrCat("base_version ", h.base_version,
                                                   " is outside [0, ", version_,
                                                   "] (the shard's current version)"));
  }
  return absl::OkStatus();
}

ParameterShard::PushSlot::~PushSlot() {
  if (shard_ != nullptr) shard_->RecordRejectedPush();
}

absl::StatusOr<ParameterShard::PushSlot> ParameterShard::BeginPush(const PushHeaderInfo& h) {
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPushHeader(h); !s.ok()) {
      ++pushes_rejected_;
      return s;
    }
  }
  // The header matched the shard's range exactly, so this is the shard's size, never more.
  return PushSlot(this, h, push_buffers_.Acquire(h.length), NeedsSquares());
}

double ParameterShard::TrainedNorm(absl::Span<const float> gradient,
                                   double sum_of_squares) const {
  if (!NeedsSquares()) return 0;
  for (float b : gradient.subspan(trained_)) sum_of_squares -= static_cast<double>(b) * b;
  return std::sqrt(std::max(0.0, sum_of_squares));
}

bool ParameterShard::Clip(absl::Span<float> gradient, double norm) const {
  double bound = config_.clip_norm > 0 ? config_.clip_norm : HUGE_VAL;
  // A round's contributions are summed as they are (NormGuard judges none of them either).
  const double reference = norm_reference_.load(std::memory_order_relaxed);
  if (config_.clip_norm_ratio > 0 && reference > 0 && !policy_->spec().rounds()) {
    bound = std::min(bound, config_.clip_norm_ratio * reference);
  }
  if (norm <= bound) return false;
  const float scale = static_cast<float>(bound / norm);
  for (float& g : gradient) g *= scale;
  return true;
}

absl::StatusOr<PushOutcome> ParameterShard::Push(const PushHeaderInfo& h,
                                                 absl::Span<const float> gradient) {
  absl::StatusOr<PushSlot> slot = BeginPush(h);
  if (!slot.ok()) return slot.status();
  if (static_cast<int64_t>(gradient.size()) != h.length) {
    return absl::InvalidArgumentError(
        absl::StrCat("push declares ", h.length, " values, carries ", gradient.size()));
  }
  std::copy(gradient.begin(), gradient.end(), slot->gradient().begin());
  return Commit(*std::move(slot));
}

absl::StatusOr<PushOutcome> ParameterShard::Commit(PushSlot slot) {
  const PushHeaderInfo h = slot.header_;
  slot.shard_ = nullptr;  // counted here from now on
  absl::Span<float> gradient = slot.gradient();
  // Scanned (unless its source scanned it as it came) and clipped outside the lock, on this
  // thread: concurrent pushes scan side by side, and the apply threads (which an apply waits for
  // holding the locks) are not made to wait on scans.
  const GradientSummary scan = slot.scan_.count() == static_cast<int64_t>(gradient.size())
                                   ? slot.scan_.Finish()
                                   : ScanGradient(gradient, nullptr, NeedsSquares());
  const double norm = TrainedNorm(gradient, scan.sum_of_squares);  // before clipping
  absl::Status status;
  bool clipped = false;
  if (scan.first_nonfinite >= 0) {
    status = absl::InvalidArgumentError(
        absl::StrCat("gradient value at offset ", h.offset + scan.first_nonfinite, " is ",
                     gradient[scan.first_nonfinite], " (not finite)"));
  } else {
    clipped = Clip(gradient.first(trained_), norm);
  }

  Completions answers(this);
  absl::MutexLock lock(&mu_);
  // The header was checked under an earlier lock; since then the version can have moved forward
  // and a newer process of this worker can have registered.
  if (status.ok()) status = CheckIncarnation(h.worker_id, h.incarnation);
  if (status.ok() && h.sequence <= members_.Find(h.worker_id)->last_sequence) {
    ++pushes_duplicate_;
    return PushOutcome{version_, 0, /*duplicate=*/true, false};
  }
  absl::StatusOr<ShardChange> change = status.ok() ? Decide(h, gradient, norm) : status;
  if (change.ok()) {
    // A compensated gradient (DC-ASGD) has no known bound.
    const bool scanned = change->values.data() == gradient.data();
    if (scanned && !clipped && change->kind == ShardChange::Kind::kUpdate) {
      change->forward_tag = slot.forward_tag_;
    }
    status = Apply(*change, scanned ? scan.max_abs : std::numeric_limits<float>::infinity());
    if (!status.ok()) ++updates_nonfinite_;
  } else {
    status = change.status();
  }
  if (!status.ok()) {
    ++pushes_rejected_;
    return status;
  }
  // Taken (applied, added to the round, or dropped by policy).
  pushes_clipped_ += clipped;
  const bool dropped = change->kind == ShardChange::Kind::kTaken;
  if (!dropped) {
    norm_guard_.Accept(h.worker_id, norm);
    norm_reference_.store(norm_guard_.reference(), std::memory_order_relaxed);
  }
  if (change->kind == ShardChange::Kind::kJoinRound) MaybeCloseRound();
  AnswerWaiters(&answers);
  return PushOutcome{version_, change->staleness, false, dropped, change->forward_tag != 0};
}

absl::StatusOr<ShardChange> ParameterShard::Decide(const PushHeaderInfo& h,
                                                   absl::Span<const float> gradient, double norm) {
  using Kind = ShardChange::Kind;
  using Drop = ShardChange::Drop;
  const Membership::Worker& worker = *members_.Find(h.worker_id);
  absl::StatusOr<ConsistencyPolicy::Take> take =
      policy_->OnPush(State(), worker, {h.worker_id, h.sequence, h.base_version});
  if (!take.ok()) return take.status();
  // Taken in any case: the sequence is used up and the worker made progress.
  ShardChange c{.kind = Kind::kTaken,
                .worker_id = h.worker_id,
                .sequence = h.sequence,
                .clock = worker.clock + 1,
                .staleness = version_ - h.base_version};
  if (*take == ConsistencyPolicy::Take::kDropLate) {
    c.drop = Drop::kLate;
  } else if (*take == ConsistencyPolicy::Take::kJoinRound) {
    c.kind = Kind::kJoinRound;
    c.staleness = 0;  // a round gathers the gradients of its own version only
    c.values = gradient;
  } else if (config_.max_staleness >= 0 && c.staleness > config_.max_staleness) {
    c.drop = Drop::kStale;
  } else if (absl::Status absurd = norm_guard_.Check(h.worker_id, norm); !absurd.ok()) {
    // Dropped like a stale push (the worker carries on), not refused: its other shards may
    // have applied their parts, and one absurd slice is no reason to end a worker.
    c.drop = Drop::kNorm;
    if (pushes_dropped_norm_ % 100 == 0) {
      PS_LOG(WARNING) << "worker " << h.worker_id << ": " << absurd.message() << " ("
                      << pushes_dropped_norm_ + 1 << " dropped so; logged every 100th)";
    }
  } else {
    c.kind = Kind::kUpdate;
    c.learning_rate = LearningRate();
    if (config_.staleness_aware_lr) {
      c.learning_rate /= static_cast<float>(std::max<int64_t>(1, c.staleness));
    }
    c.values = Compensate(h.worker_id, h.base_version, gradient);
  }
  return c;
}

absl::Span<const float> ParameterShard::Compensate(int worker_id, int64_t base_version,
                                                   absl::Span<const float> gradient) {
  if (config_.dc_lambda <= 0) return gradient;
  // The copy of the weights this gradient was computed from, if the shard kept it.
  auto w = pulled_weights_.find(worker_id);
  if (w == pulled_weights_.end()) return gradient;
  auto v = w->second.find(base_version);
  if (v == w->second.end()) return gradient;
  const std::vector<float>& pulled = v->second;
  // DC-ASGD (Zheng et al. 2017): g + lambda * g * g * (w_now - w_at_pull) approximates the
  // gradient at the current weights from the stale one.
  scratch_.assign(gradient.begin(), gradient.end());  // the buffers' values as pushed
  values_.Read([&](absl::Span<const float> weights) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (int64_t i = 0; i < trained_; ++i) {
      const float g = gradient[i];
      scratch_[i] = g + config_.dc_lambda * g * g * (weights[i] - pulled[i]);
    }
  });
  return scratch_;
}

absl::Status ParameterShard::Apply(ShardChange c, float max_abs) {
  using Kind = ShardChange::Kind;
  switch (c.kind) {
    case Kind::kInitialize:
      values_.Reset(c.values, version_);
      initialized_ = true;
      break;
    case Kind::kUpdate:
      if (absl::Status s = values_.Update(c.values, c.learning_rate, version_, max_abs); !s.ok()) {
        return s;
      }
      ++version_;
      // A round's update counts one applied push per contributor.
      for (size_t n = c.worker_id >= 0 ? 1 : round_.contributors().size(); n > 0; --n) {
        staleness_.Add(c.staleness);
      }
      break;
    case Kind::kJoinRound: {
      // A lower rank is still expected if it may yet push: not registered, or active.
      auto expected = [this](int id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        const Membership::Worker* w = members_.Find(id);
        return w == nullptr || w->active;
      };
      if (absl::Status s = round_.Add(c.worker_id, c.values, expected); !s.ok()) return s;
      break;
    }
    case Kind::kTaken:
      ++(c.drop == ShardChange::Drop::kLate   ? pushes_dropped_late_
         : c.drop == ShardChange::Drop::kNorm ? pushes_dropped_norm_
                                              : pushes_dropped_stale_);
      break;
  }
  if (c.worker_id >= 0 && c.kind != Kind::kInitialize) {
    const absl::Time now = MonotonicNow();
    Membership::Worker& w = members_.Touch(c.worker_id, now, version_);
    w.last_sequence = c.sequence;
    w.clock = c.clock;
    w.last_progress = now;
    if (c.kind == Kind::kUpdate || c.kind == Kind::kJoinRound) {
      ++w.pushes_applied;
      w.staleness.Add(c.staleness);
    }
  }
  if (c.kind != Kind::kJoinRound) {
    c.index = ++changes_;
    c.version = version_;
    if (on_change_) on_change_(c);
  }
  return absl::OkStatus();
}

float ParameterShard::LearningRate() const {
  float lr = schedule_.At(version_);
  if (config_.scale_lr_by_workers) lr *= std::max(1, members_.ActiveCount());
  return lr;
}

void ParameterShard::MaybeCloseRound() {
  if (!policy_->RoundComplete(State())) {
    const int unregistered = policy_->Unregistered(State());
    if (round_.open() && unregistered > 0 && !logged_registration_wait_) {
      logged_registration_wait_ = true;
      const int registered = config_.num_workers - unregistered;
      PS_LOG(INFO) << policy_->Name() << ": round for version " << version_ << " waits for "
                   << config_.num_workers << " workers to register, " << registered
                   << (registered == 1 ? " has" : " have");
    }
    return;
  }
  absl::Span<float> sum = round_.Fold();
  const float scale = 1.0f / static_cast<float>(round_.contributors().size());
  for (float& g : sum) g *= scale;
  if (absl::Status s = Apply({.kind = ShardChange::Kind::kUpdate,
                              .learning_rate = LearningRate(),
                              .values = sum},
                             std::numeric_limits<float>::infinity());
      !s.ok()) {
    // The average would poison the weights: the round is discarded (its workers are released
    // and push again for the same version) and the weights stay as they were.
    ++updates_nonfinite_;
    PS_LOG(WARNING) << policy_->Name() << " round for version " << version_
                    << " discarded: " << s.message();
  }
  round_.Clear();
}

void ParameterShard::RecordRejectedPush() {
  absl::MutexLock lock(&mu_);
  ++pushes_rejected_;
}

bool ParameterShard::Pending(int worker_id, int64_t after_sequence) const {
  auto it = members_.workers().find(worker_id);
  return worker_id >= 0 && it != members_.workers().end() &&
         it->second.last_sequence < after_sequence;
}

bool ParameterShard::Admits(int worker_id, int64_t after_sequence) const {
  if (worker_id < 0) return true;
  auto it = members_.workers().find(worker_id);
  if (it == members_.workers().end()) return true;
  return policy_->Admits(State(), worker_id, it->second, Pending(worker_id, after_sequence));
}

int64_t ParameterShard::StartRead(ReadRequest r, ReadDone done) {
  absl::Status bad = CheckModel(r.model);
  if (bad.ok() && r.worker_id >= 0) bad = CheckWorkerId(r.worker_id);
  if (r.length == 0 && r.offset == 0) {
    r.offset = range_.begin;
    r.length = range_.size();
  }
  if (bad.ok()) bad = CheckRange(r.offset, r.length);
  Completions answers(this);
  absl::MutexLock lock(&mu_);
  if (bad.ok() && r.worker_id >= 0) members_.Refresh(r.worker_id, MonotonicNow(), version_);
  if (!bad.ok()) {
    answers.Fail(std::move(done), bad);
    return 0;
  }
  if (TryAnswer(r, absl::Now(), done, &answers)) return 0;
  return pulls_waiting_.Add({std::move(r), std::move(done)});
}

bool ParameterShard::TryAnswer(const ReadRequest& r, absl::Time now, const ReadDone& done,
                               Completions* out) {
  if (shutdown_) {
    out->Fail(done, absl::UnavailableError("shard is shutting down"));
    return true;
  }
  if (initialized_ && Admits(r.worker_id, r.after_sequence)) {
    ++pulls_;
    const Membership::Worker* w = r.worker_id >= 0 ? members_.Find(r.worker_id) : nullptr;
    bool whole_shard = r.offset == range_.begin && r.length == range_.size();
    out->Read(done, r, config_.dc_lambda > 0 && whole_shard && w != nullptr && w->active);
    return true;
  }
  if (now < r.deadline) return false;
  // Held back by the consistency model: waiting longer is the protocol (the shard bounds it with
  // the progress timeout), so the client asks again at once. Not initialised: the client retries
  // within its budget for unavailable shards, so it cannot wait forever for an initialiser.
  out->Fail(done,
            initialized_
                ? absl::AbortedError(absl::StrCat("worker ", r.worker_id, " is still held back by ",
                                                  policy_->Name(), "; pull again"))
                : absl::UnavailableError(absl::StrCat(
                      "shard ", config_.shard_index,
                      " is not initialised yet (waiting for worker 0 to initialise it)")));
  return true;
}

void ParameterShard::AnswerWaiters(Completions* out) {
  const absl::Time now = absl::Now();
  pulls_waiting_.AnswerEach([&](PullQueue::Waiter& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return TryAnswer(w.request, now, w.done, out);
  });
}

void ParameterShard::AnswerExpired() {
  Completions answers(this);
  absl::MutexLock lock(&mu_);
  AnswerWaiters(&answers);  // those past their deadline get ABORTED
}

void ParameterShard::KeepPulledCopy(int worker_id, const Snapshot& snapshot) {
  std::vector<float> copy(snapshot.values.span().begin(), snapshot.values.span().end());
  absl::MutexLock lock(&mu_);
  const Membership::Worker* w = members_.Find(worker_id);
  if (w == nullptr || !w->active) return;
  std::map<int64_t, std::vector<float>>& copies = pulled_weights_[worker_id];
  copies[snapshot.version] = std::move(copy);
  while (copies.size() > 2) copies.erase(copies.begin());
}

void ParameterShard::CancelRead(int64_t ticket) {
  std::optional<PullQueue::Waiter> waiter = pulls_waiting_.Remove(ticket);
  if (waiter) waiter->done(absl::CancelledError("the pull was cancelled"));
}

absl::StatusOr<ParameterShard::Snapshot> ParameterShard::Read(const ModelIdentity& model,
                                                              int worker_id, int64_t offset,
                                                              int64_t length, absl::Time deadline,
                                                              int64_t after_sequence) {
  absl::Notification answered;
  std::optional<absl::StatusOr<Snapshot>> result;
  StartRead({model, worker_id, offset, length, after_sequence, deadline},
            [&](absl::StatusOr<Snapshot> r) {
              result.emplace(std::move(r));
              answered.Notify();
            });
  answered.WaitForNotification();
  return *std::move(result);
}

ShardStats ParameterShard::AllStats() const {
  ShardStats all = Stats();
  while (all.next_worker >= 0) {
    ShardStats page = Stats(all.next_worker);
    all.workers.insert(all.workers.end(), page.workers.begin(), page.workers.end());
    all.next_worker = page.workers.empty() ? -1 : page.next_worker;
  }
  return all;
}

ShardStats ParameterShard::Stats(int first_worker, int max_workers) const {
  absl::ReaderMutexLock lock(&mu_);
  ShardStats s;
  s.shard_index = config_.shard_index;
  s.num_shards = config_.num_shards;
  s.initialized = initialized_;
  s.range = range_;
  s.version = version_;
  s.pushes_applied = staleness_.total();
  s.pushes_rejected = pushes_rejected_;
  s.pushes_duplicate = pushes_duplicate_;
  s.pushes_dropped_late = pushes_dropped_late_;
  s.pushes_dropped_stale = pushes_dropped_stale_;
  s.pushes_dropped_norm = pushes_dropped_norm_;
  s.updates_nonfinite = updates_nonfinite_;
  s.pushes_clipped = pushes_clipped_;
  s.pulls = pulls_;
  s.pulls_waiting = pulls_waiting_.size();
  s.registered_workers = static_cast<int>(members_.workers().size());
  s.active_workers = members_.ActiveCount();
  s.learning_rate = LearningRate();
  s.model_fingerprint = model_.fingerprint;
  s.optimizer = config_.optimizer.name;
  s.consistency = policy_->Name();
  s.staleness_counts = staleness_.counts();
  const absl::Time now = MonotonicNow();
  const int page = std::clamp(max_workers, 0, kMaxStatsWorkers);
  for (auto it = members_.workers().lower_bound(first_worker); it != members_.workers().end();
       ++it) {
    if (static_cast<int>(s.workers.size()) == page) {
      s.next_worker = it->first;
      break;
    }
    const Membership::Worker& w = it->second;
    s.workers.push_back({it->first, w.active, w.clock, w.pushes_applied,
                         absl::ToDoubleSeconds(now - w.last_seen), w.staleness.counts(),
                         w.incarnation});
  }
  return s;
}

void ParameterShard::Shutdown() {
  Completions answers(this);
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  AnswerWaiters(&answers);
}

}  // namespace ps
