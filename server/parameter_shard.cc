#include "server/parameter_shard.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

std::string RangeText(int64_t lo, int64_t hi) { return absl::StrCat("[", lo, ", ", hi, ")"); }

// Returns the index of the first NaN or infinity, or -1.
int64_t FirstNonFinite(absl::Span<const float> v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace

ParameterShard::ParameterShard(int shard_index, int num_shards, OptimizerConfig optimizer)
    : shard_index_(shard_index), num_shards_(num_shards), optimizer_config_(std::move(optimizer)) {}

absl::Status ParameterShard::CheckModel(const ModelIdentity& m) const {
  if (m.num_shards != num_shards_) {
    return absl::FailedPreconditionError(absl::StrCat("client expects ", m.num_shards,
                                                      " shards, this cluster has ", num_shards_));
  }
  if (m.total_params <= 0 || m.fingerprint.empty()) {
    return absl::InvalidArgumentError("model identity needs a fingerprint and total_params > 0");
  }
  if (initialized_ &&
      (m.fingerprint != model_.fingerprint || m.total_params != model_.total_params)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model mismatch: shard holds ", model_.fingerprint, " (", model_.total_params,
        " parameters), client has ", m.fingerprint, " (", m.total_params, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Range> ParameterShard::CheckInitialize(const ModelIdentity& model, int64_t offset,
                                                      int64_t length) const {
  absl::ReaderMutexLock lock(&mu_);
  if (absl::Status s = CheckModel(model); !s.ok()) return s;
  Range r = PartRange(model.total_params, shard_index_, num_shards_);
  if (r.size() > kMaxShardElements) {
    return absl::InvalidArgumentError(absl::StrCat("shard would hold ", r.size(),
                                                   " parameters, above the limit of ",
                                                   kMaxShardElements));
  }
  if (offset != r.begin || length != r.size()) {
    return absl::InvalidArgumentError(absl::StrCat("initialisation covers ",
                                                   RangeText(offset, offset + length), ", shard ",
                                                   shard_index_, " owns ",
                                                   RangeText(r.begin, r.end)));
  }
  return r;
}

absl::StatusOr<bool> ParameterShard::Initialize(const ModelIdentity& model, int64_t offset,
                                                absl::Span<const float> values) {
  absl::StatusOr<Range> range =
      CheckInitialize(model, offset, static_cast<int64_t>(values.size()));
  if (!range.ok()) return range.status();
  if (int64_t bad = FirstNonFinite(values); bad >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial value at offset ", offset + bad, " is not finite"));
  }
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
      MakeOptimizer(optimizer_config_, range->size());
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
  if (worker_id >= 0) last = last_sequence_.try_emplace(worker_id, -1).first->second;
  return Registration{shard_index_, initialized_, range_, version_, last};
}

absl::Status ParameterShard::CheckRange(int64_t offset, int64_t length) const {
  if (length <= 0 || offset < range_.begin || offset > range_.end - length) {
    return absl::InvalidArgumentError(absl::StrCat("range ", RangeText(offset, offset + length),
                                                   " is not inside shard ", shard_index_, "'s ",
                                                   RangeText(range_.begin, range_.end)));
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::CheckPushHeader(const PushHeaderInfo& h) const {
  absl::ReaderMutexLock lock(&mu_);
  if (!initialized_) return absl::FailedPreconditionError("shard is not initialised yet");
  if (last_sequence_.count(h.worker_id) == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", h.worker_id, " has not registered with shard ", shard_index_));
  }
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
    status = absl::InvalidArgumentError(absl::StrCat("push declares ", h.length, " values, carries ",
                                                     gradient.size()));
  }
  // Checked outside the lock: the scan is the costly part and needs no shared state.
  if (int64_t bad = FirstNonFinite(gradient); status.ok() && bad >= 0) {
    status = absl::InvalidArgumentError(absl::StrCat("gradient value at offset ", h.offset + bad,
                                                     " is ", gradient[bad], " (not finite)"));
  }
  absl::MutexLock lock(&mu_);
  if (!status.ok()) {
    ++pushes_rejected_;
    return status;
  }
  int64_t& last = last_sequence_[h.worker_id];
  if (h.sequence <= last) {
    ++pushes_duplicate_;
    return PushOutcome{version_, 0, /*duplicate=*/true};
  }
  int64_t staleness = version_ - h.base_version;
  optimizer_->Apply(absl::MakeSpan(weights_).subspan(h.offset - range_.begin, h.length), gradient,
                    h.offset - range_.begin, optimizer_config_.learning_rate, version_);
  last = h.sequence;
  staleness_.Add(staleness);
  ++version_;
  return PushOutcome{version_, staleness, false};
}

void ParameterShard::RecordRejectedPush() {
  absl::MutexLock lock(&mu_);
  ++pushes_rejected_;
}

absl::StatusOr<ParameterShard::Snapshot> ParameterShard::Read(int64_t offset, int64_t length,
                                                             absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return initialized_ || shutdown_; };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  if (shutdown_) return absl::UnavailableError("shard is shutting down");
  if (!initialized_) {
    return absl::UnavailableError(absl::StrCat("shard ", shard_index_, " is not initialised yet"));
  }
  if (length == 0 && offset == 0) {
    offset = range_.begin;
    length = range_.size();
  }
  if (absl::Status s = CheckRange(offset, length); !s.ok()) return s;
  ++pulls_;
  auto first = weights_.begin() + (offset - range_.begin);
  return Snapshot{version_, offset, std::vector<float>(first, first + length)};
}

ShardStats ParameterShard::Stats() const {
  absl::ReaderMutexLock lock(&mu_);
  ShardStats s;
  s.shard_index = shard_index_;
  s.num_shards = num_shards_;
  s.initialized = initialized_;
  s.range = range_;
  s.version = version_;
  s.pushes_applied = staleness_.total();
  s.pushes_rejected = pushes_rejected_;
  s.pushes_duplicate = pushes_duplicate_;
  s.pulls = pulls_;
  s.registered_workers = static_cast<int>(last_sequence_.size());
  s.model_fingerprint = model_.fingerprint;
  s.optimizer = optimizer_config_.name;
  s.staleness_counts = staleness_.counts();
  return s;
}

void ParameterShard::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

}  // namespace ps
