#include "server/parameter_shard.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

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

absl::Status ParseConsistency(const std::string& text, ShardConfig* config) {
  int bound = 0;
  if (text == "async") {
    config->mode = ConsistencyMode::kAsync;
  } else if (text == "sync") {
    config->mode = ConsistencyMode::kSync;
  } else if (text.rfind("ssp:", 0) == 0 && absl::SimpleAtoi(text.substr(4), &bound) && bound >= 0) {
    config->mode = ConsistencyMode::kSsp;
    config->staleness_bound = bound;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown consistency model '", text,
                                                   "': expected async, sync or ssp:S with S >= 0"));
  }
  return absl::OkStatus();
}

std::string ConsistencyName(const ShardConfig& config) {
  switch (config.mode) {
    case ConsistencyMode::kSync:
      return "sync";
    case ConsistencyMode::kSsp:
      return absl::StrCat("ssp:", config.staleness_bound);
    default:
      return "async";
  }
}

absl::StatusOr<std::unique_ptr<ParameterShard>> ParameterShard::Create(const ShardConfig& c) {
  if (c.num_shards < 1 || c.shard_index < 0 || c.shard_index >= c.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shard_index=", c.shard_index, " must be in [0, --num_shards=", c.num_shards, ")"));
  }
  if (absl::StatusOr<std::unique_ptr<Optimizer>> o = MakeOptimizer(c.optimizer, 0); !o.ok()) {
    return o.status();
  }
  absl::StatusOr<LearningRateSchedule> schedule = LearningRateSchedule::Create(c.learning_rate);
  if (!schedule.ok()) return schedule.status();
  if (c.backup_workers < 0) return absl::InvalidArgumentError("--backup_workers must be >= 0");
  if (c.lease <= absl::ZeroDuration()) return absl::InvalidArgumentError("the lease must be > 0");
  if (!(c.dc_lambda >= 0) || !std::isfinite(c.dc_lambda)) {
    return absl::InvalidArgumentError("--dc_lambda must be a number >= 0");
  }
  return std::unique_ptr<ParameterShard>(new ParameterShard(c, *std::move(schedule)));
}

ParameterShard::ParameterShard(const ShardConfig& config, LearningRateSchedule schedule)
    : config_(config), schedule_(std::move(schedule)), members_(config.lease) {}

absl::Status ParameterShard::CheckModel(const ModelIdentity& m) const {
  if (m.num_shards != config_.num_shards) {
    return absl::FailedPreconditionError(absl::StrCat(
        "client expects ", m.num_shards, " shards, this cluster has ", config_.num_shards));
  }
  if (m.total_params <= 0 || m.fingerprint.empty()) {
    return absl::InvalidArgumentError("model identity needs a fingerprint and total_params > 0");
  }
  if (initialized_ &&
      (m.fingerprint != model_.fingerprint || m.total_params != model_.total_params)) {
    return absl::FailedPreconditionError(
        absl::StrCat("model mismatch: shard holds ", model_.fingerprint, " (", model_.total_params,
                     " parameters), client has ", m.fingerprint, " (", m.total_params, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Range> ParameterShard::CheckInitialize(const ModelIdentity& model, int64_t offset,
                                                      int64_t length) const {
  absl::ReaderMutexLock lock(&mu_);
  if (absl::Status s = CheckModel(model); !s.ok()) return s;
  Range r = PartRange(model.total_params, config_.shard_index, config_.num_shards);
  if (r.size() > kMaxShardElements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard would hold ", r.size(), " parameters, above the limit of ", kMaxShardElements));
  }
  if (offset != r.begin || length != r.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("initialisation covers ", RangeText(offset, End(offset, length)), ", shard ",
                     config_.shard_index, " owns ", RangeText(r.begin, r.end)));
  }
  return r;
}

bool ParameterShard::initialized() const {
  absl::ReaderMutexLock lock(&mu_);
  return initialized_;
}

bool ParameterShard::TryBeginInitialize() {
  absl::MutexLock lock(&mu_);
  if (initializing_) return false;
  initializing_ = true;
  return true;
}

void ParameterShard::EndInitialize() {
  absl::MutexLock lock(&mu_);
  initializing_ = false;
}

absl::StatusOr<bool> ParameterShard::Initialize(const ModelIdentity& model, int64_t offset,
                                                absl::Span<const float> values) {
  absl::StatusOr<Range> range = CheckInitialize(model, offset, static_cast<int64_t>(values.size()));
  if (!range.ok()) return range.status();
  if (int64_t bad = FirstNonFinite(values); bad >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial value at offset ", offset + bad, " is not finite"));
  }
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
      MakeOptimizer(config_.optimizer, range->size());
  if (!optimizer.ok()) return optimizer.status();

  absl::MutexLock lock(&mu_);
  if (initialized_) return false;  // a restarted initialiser: keep the trained values
  model_ = model;
  range_ = *range;
  weights_.assign(values.begin(), values.end());
  optimizer_ = *std::move(optimizer);
  initialized_ = true;
  return true;
}

absl::StatusOr<Registration> ParameterShard::Register(int worker_id, const ModelIdentity& model) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckModel(model); !s.ok()) return s;
  int64_t last = -1;
  if (worker_id >= 0) {
    Membership::Worker& w = members_.Touch(worker_id, MonotonicNow(), version_);
    w.model = model;
    last = w.last_sequence;
  }
  return Registration{
      config_.shard_index, ConsistencyName(config_), initialized_, range_, version_, last};
}

absl::StatusOr<int> ParameterShard::Heartbeat(int worker_id) {
  absl::MutexLock lock(&mu_);
  if (members_.Find(worker_id) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker_id, " has not registered with shard ", config_.shard_index));
  }
  members_.Touch(worker_id, MonotonicNow(), version_);
  return members_.ActiveCount();
}

absl::Status ParameterShard::Leave(int worker_id) {
  absl::MutexLock lock(&mu_);
  if (!members_.Leave(worker_id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker_id, " has not registered with shard ", config_.shard_index));
  }
  MaybeCloseRound();  // a round may have been waiting only for it
  return absl::OkStatus();
}

std::vector<int> ParameterShard::ExpireLeases(absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<int> expired = members_.Expire(now);
  if (!expired.empty()) MaybeCloseRound();
  return expired;
}

absl::Status ParameterShard::CheckRange(int64_t offset, int64_t length) const {
  if (length <= 0 || offset < range_.begin || offset > range_.end - length) {
    return absl::InvalidArgumentError(absl::StrCat("range ", RangeText(offset, End(offset, length)),
                                                   " is not inside shard ", config_.shard_index,
                                                   "'s ", RangeText(range_.begin, range_.end)));
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::CheckPushHeader(const PushHeaderInfo& h) const {
  absl::ReaderMutexLock lock(&mu_);
  if (!initialized_) return absl::FailedPreconditionError("shard is not initialised yet");
  auto worker = members_.workers().find(h.worker_id);
  if (h.worker_id < 0 || worker == members_.workers().end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", h.worker_id, " has not registered with shard ", config_.shard_index));
  }
  // A worker that registered before initialisation was not checked against the model then.
  if (absl::Status s = CheckModel(worker->second.model); !s.ok()) return s;
  if (h.sequence < 0) {
    return absl::InvalidArgumentError(absl::StrCat("push sequence ", h.sequence, " is negative"));
  }
  if (h.base_version < 0 || h.base_version > version_) {
    return absl::InvalidArgumentError(absl::StrCat("base_version ", h.base_version,
                                                   " is outside [0, ", version_,
                                                   "] (the shard's current version)"));
  }
  return CheckRange(h.offset, h.length);
}

absl::StatusOr<PushOutcome> ParameterShard::Push(const PushHeaderInfo& h,
                                                 absl::Span<const float> gradient) {
  absl::Status status = CheckPushHeader(h);
  if (status.ok() && static_cast<int64_t>(gradient.size()) != h.length) {
    status = absl::InvalidArgumentError(
        absl::StrCat("push declares ", h.length, " values, carries ", gradient.size()));
  }
  // Checked outside the lock: the scan is the costly part and needs no shared state.
  if (int64_t bad = FirstNonFinite(gradient); status.ok() && bad >= 0) {
    status = absl::InvalidArgumentError(absl::StrCat("gradient value at offset ", h.offset + bad,
                                                     " is ", gradient[bad], " (not finite)"));
  }
  absl::MutexLock lock(&mu_);
  // The header was checked under an earlier lock; only the version can have moved, forward.
  if (status.ok() && config_.mode == ConsistencyMode::kSync && h.base_version == version_ &&
      round_contributors_.count(h.worker_id) > 0 &&
      h.sequence > members_.Find(h.worker_id)->last_sequence) {
    status = absl::FailedPreconditionError(
        absl::StrCat("worker ", h.worker_id, " already pushed a gradient for version ", version_));
  }
  if (!status.ok()) {
    ++pushes_rejected_;
    return status;
  }
  Membership::Worker& worker = members_.Touch(h.worker_id, MonotonicNow(), version_);
  if (h.sequence <= worker.last_sequence) {
    ++pushes_duplicate_;
    return PushOutcome{version_, 0, /*duplicate=*/true, false};
  }
  worker.last_sequence = h.sequence;
  ++worker.clock;
  int64_t staleness = version_ - h.base_version;
  if (config_.mode == ConsistencyMode::kSync) {
    if (staleness > 0) {  // its round closed without it (backup workers, or it was expired)
      ++pushes_dropped_late_;
      return PushOutcome{version_, staleness, false, /*dropped=*/true};
    }
    return AddToRound(worker, h, gradient);
  }
  if (config_.mode == ConsistencyMode::kSsp && h.base_version < worker.joined_at_version) {
    // Computed before its lease expired: the others were not held back for it, so applying it
    // could break the staleness bound.
    ++pushes_dropped_late_;
    return PushOutcome{version_, staleness, false, /*dropped=*/true};
  }
  if (config_.max_staleness >= 0 && staleness > config_.max_staleness) {
    ++pushes_dropped_stale_;
    return PushOutcome{version_, staleness, false, /*dropped=*/true};
  }
  return ApplyNow(worker, h, staleness, gradient);
}

float ParameterShard::LearningRate() const {
  float lr = schedule_.At(version_);
  if (config_.scale_lr_by_workers) lr *= std::max(1, members_.ActiveCount());
  return lr;
}

PushOutcome ParameterShard::ApplyNow(Membership::Worker& worker, const PushHeaderInfo& h,
                                     int64_t staleness, absl::Span<const float> gradient) {
  float lr = LearningRate();
  if (config_.staleness_aware_lr) lr /= static_cast<float>(std::max<int64_t>(1, staleness));
  int64_t local = h.offset - range_.begin;
  // The copy of the weights this gradient was computed from, if the shard kept it.
  const std::vector<float>* pulled = nullptr;
  if (auto w = pulled_weights_.find(h.worker_id); w != pulled_weights_.end()) {
    if (auto v = w->second.find(h.base_version); v != w->second.end()) pulled = &v->second;
  }
  if (config_.dc_lambda > 0 && pulled != nullptr) {
    // DC-ASGD (Zheng et al. 2017): g + lambda * g * g * (w_now - w_at_pull) approximates the
    // gradient at the current weights from the stale one.
    compensated_.resize(gradient.size());
    for (size_t i = 0; i < gradient.size(); ++i) {
      float g = gradient[i];
      compensated_[i] =
          g + config_.dc_lambda * g * g * (weights_[local + i] - (*pulled)[local + i]);
    }
    gradient = compensated_;
  }
  optimizer_->Apply(absl::MakeSpan(weights_).subspan(local, h.length), gradient, local, lr,
                    version_);
  ++version_;
  staleness_.Add(staleness);
  worker.staleness.Add(staleness);
  ++worker.pushes_applied;
  return PushOutcome{version_, staleness, false, false};
}

PushOutcome ParameterShard::AddToRound(Membership::Worker& worker, const PushHeaderInfo& h,
                                       absl::Span<const float> gradient) {
  if (round_sum_.empty()) round_sum_.assign(range_.size(), 0.0f);
  float* sum = round_sum_.data() + (h.offset - range_.begin);
  for (size_t i = 0; i < gradient.size(); ++i) sum[i] += gradient[i];
  round_contributors_.insert(h.worker_id);
  worker.staleness.Add(0);
  ++worker.pushes_applied;
  MaybeCloseRound();
  return PushOutcome{version_, 0, false, false};
}

void ParameterShard::MaybeCloseRound() {
  if (config_.mode != ConsistencyMode::kSync || round_contributors_.empty()) return;
  int needed = std::max(1, members_.ActiveCount() - config_.backup_workers);
  if (static_cast<int>(round_contributors_.size()) < needed) return;
  float scale = 1.0f / static_cast<float>(round_contributors_.size());
  for (float& g : round_sum_) g *= scale;
  optimizer_->Apply(absl::MakeSpan(weights_), round_sum_, 0, LearningRate(), version_);
  ++version_;
  for (size_t i = 0; i < round_contributors_.size(); ++i) staleness_.Add(0);
  std::fill(round_sum_.begin(), round_sum_.end(), 0.0f);
  round_contributors_.clear();
}

void ParameterShard::RecordRejectedPush() {
  absl::MutexLock lock(&mu_);
  ++pushes_rejected_;
}

bool ParameterShard::Admits(int worker_id) const {
  if (worker_id < 0) return true;
  auto it = members_.workers().find(worker_id);
  if (it == members_.workers().end()) return true;
  switch (config_.mode) {
    case ConsistencyMode::kSync:
      return round_contributors_.count(worker_id) == 0;
    case ConsistencyMode::kSsp:
      return it->second.clock - config_.staleness_bound <= members_.MinActiveClock();
    default:
      return true;
  }
}

absl::StatusOr<ParameterShard::Snapshot> ParameterShard::Read(const ModelIdentity& model,
                                                              int worker_id, int64_t offset,
                                                              int64_t length, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (worker_id >= 0 && members_.Find(worker_id) != nullptr) {
    members_.Touch(worker_id, MonotonicNow(), version_);
  }
  auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return shutdown_ || (initialized_ && Admits(worker_id));
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  if (shutdown_) return absl::UnavailableError("shard is shutting down");
  if (!initialized_) {  // waiting for the initialiser is normal: the client pulls again
    return absl::AbortedError(
        absl::StrCat("shard ", config_.shard_index, " is not initialised yet; pull again"));
  }
  if (absl::Status s = CheckModel(model); !s.ok()) return s;
  if (!Admits(worker_id)) {
    return absl::AbortedError(absl::StrCat("worker ", worker_id, " is still held back by ",
                                           ConsistencyName(config_), "; pull again"));
  }
  if (length == 0 && offset == 0) {
    offset = range_.begin;
    length = range_.size();
  }
  if (absl::Status s = CheckRange(offset, length); !s.ok()) return s;
  ++pulls_;
  if (config_.dc_lambda > 0 && worker_id >= 0 && members_.Find(worker_id) != nullptr) {
    std::map<int64_t, std::vector<float>>& copies = pulled_weights_[worker_id];
    copies[version_] = weights_;
    while (copies.size() > 2) copies.erase(copies.begin());
  }
  BufferPool::Lease values = snapshot_buffers_.Acquire(length);
  std::copy_n(weights_.begin() + (offset - range_.begin), length, values.span().begin());
  return Snapshot{version_, offset, std::move(values)};
}

ShardStats ParameterShard::Stats() const {
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
  s.pulls = pulls_;
  s.registered_workers = static_cast<int>(members_.workers().size());
  s.active_workers = members_.ActiveCount();
  s.learning_rate = LearningRate();
  s.model_fingerprint = model_.fingerprint;
  s.optimizer = config_.optimizer.name;
  s.consistency = ConsistencyName(config_);
  s.staleness_counts = staleness_.counts();
  absl::Time now = MonotonicNow();
  for (const auto& [id, w] : members_.workers()) {
    s.workers.push_back({id, w.active, w.clock, w.pushes_applied,
                         absl::ToDoubleSeconds(now - w.last_seen), w.staleness.counts()});
  }
  return s;
}

void ParameterShard::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

}  // namespace ps
