// ParameterShard's state as a whole: Checkpoint and Restore (checkpoints, state transfer to a
// backup), and ApplyChange (a backup repeating its primary's changes). See parameter_shard.h.
#include <algorithm>
#include <limits>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/state/parameter_shard.h"
#include "server/state/parameter_shard_completions.h"

namespace ps {

absl::Status ParameterShard::Checkpoint(ShardState* out) const {
  absl::ReaderMutexLock lock(&mu_);
  v1::ShardState& h = out->header;
  h.Clear();
  h.set_model(model_.fingerprint);
  h.set_shard_index(config_.shard_index);
  h.set_num_shards(config_.num_shards);
  h.set_optimizer(config_.optimizer.name);
  h.set_consistency(policy_->Name());
  h.set_version(version_);
  h.set_changes(changes_);
  if (!initialized_) return absl::FailedPreconditionError("shard is not initialised yet");
  for (const auto& [id, w] : members_.workers()) {
    v1::WorkerState* saved = h.add_workers();
    saved->set_id(id);
    saved->set_last_sequence(w.last_sequence);
    saved->set_clock(w.clock);
    saved->set_pushes_applied(w.pushes_applied);
    saved->set_joined_at_version(w.joined_at_version);
    saved->set_incarnation(w.incarnation);
  }
  values_.Export(out);
  if (round_.open()) {
    // Its held pushes folded in: a restored round has every contributor folded.
    round_.SaveSum(&out->AddTensor(kRoundSumTensor));
    for (int id : round_.contributors()) h.add_round_contributors(id);
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::Restore(const ShardState& state) {
  const v1::ShardState& h = state.header;
  auto differs = [&](const std::string& what, const auto& theirs, const auto& ours) {
    return absl::InvalidArgumentError(
        absl::StrCat("the state is of ", what, " ", theirs, ", this shard has ", ours));
  };
  if (h.model() != model_.fingerprint) return differs("model", h.model(), model_.fingerprint);
  if (h.shard_index() != config_.shard_index || h.num_shards() != config_.num_shards) {
    return differs("shard", absl::StrCat(h.shard_index(), "/", h.num_shards()),
                   absl::StrCat(config_.shard_index, "/", config_.num_shards));
  }
  if (h.optimizer() != config_.optimizer.name) {
    return differs("optimizer", h.optimizer(), config_.optimizer.name);
  }
  // What a pushed vector and an open round's sum are (gradients or changes of the model) must
  // agree; the other settings of a model (S, T, H) may change across a restart.
  absl::StatusOr<ConsistencySpec> theirs = ParseConsistencySpec(h.consistency());
  if (!theirs.ok() || theirs->local_models() != policy_->spec().local_models() ||
      theirs->rounds() != policy_->spec().rounds()) {
    return differs("consistency", h.consistency(), policy_->Name());
  }
  if (!state.has_model()) return absl::InvalidArgumentError("the state holds no model");
  if (absl::Status s = CheckStateShape(state, range_.size()); !s.ok()) return s;
  if (absl::Status s = CheckStateInvariants(state); !s.ok()) return s;
  for (const std::string& name : h.tensors()) {
    if (name != kValuesTensor && name != kRoundSumTensor &&
        name.rfind(kOptimizerTensorPrefix, 0) != 0) {
      return absl::InvalidArgumentError("the state has a tensor this shard does not know: " + name);
    }
  }
  if (h.round_contributors_size() > 0 && state.Find(kRoundSumTensor) == nullptr) {
    return absl::InvalidArgumentError("the state has an open round without its sum");
  }
  for (int id : h.round_contributors()) {
    if (absl::Status s = CheckWorkerId(id); !s.ok()) return s;
  }
  for (const v1::WorkerState& w : h.workers()) {
    if (absl::Status s = CheckWorkerId(w.id()); !s.ok()) return s;
  }
  Completions answers(this);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = values_.Import(state, h.version()); !s.ok()) return s;
  version_ = h.version();
  changes_ = h.changes();
  restored_ = true;
  members_ = Membership(config_.lease);
  pulled_weights_.clear();
  const absl::Time now = MonotonicNow();
  for (const v1::WorkerState& w : h.workers()) {
    Membership::Worker& m = members_.Touch(w.id(), now, version_);
    m.last_sequence = w.last_sequence();
    m.clock = w.clock();
    m.pushes_applied = w.pushes_applied();
    m.joined_at_version = w.joined_at_version();
    m.incarnation = w.incarnation();
    last_incarnation_ = std::max(last_incarnation_, w.incarnation());
  }
  round_.Clear();
  if (h.round_contributors_size() > 0) {
    round_.Restore(*state.Find(kRoundSumTensor),
                   std::set<int>(h.round_contributors().begin(), h.round_contributors().end()));
  }
  initialized_ = true;
  AnswerWaiters(&answers);
  return absl::OkStatus();
}

absl::Status ParameterShard::ApplyChange(const ShardChange& c) {
  using Kind = ShardChange::Kind;
  // Bounds the update's gradient (see Optimizer::Apply); scanned before the lock is taken.
  const float max_abs = c.kind == Kind::kUpdate ? ScanGradient(c.values).max_abs
                                                : std::numeric_limits<float>::infinity();
  Completions answers(this);
  absl::MutexLock lock(&mu_);
  auto mismatch = [&](absl::string_view what) {
    return absl::FailedPreconditionError(absl::StrCat("change ", c.index, " (version ", c.version,
                                                      ") does not fit this shard: ", what));
  };
  if (c.index != changes_ + 1) {
    return mismatch(absl::StrCat("the shard has applied ", changes_, " changes"));
  }
  const bool sized = static_cast<int64_t>(c.values.size()) == range_.size();
  if (c.kind == Kind::kInitialize) {
    if (initialized_ || !sized) return mismatch("an initialisation of an initialised shard");
  } else if (c.kind == Kind::kJoinRound) {
    return mismatch("a round's contribution (rounds are not replicated)");
  } else if (!initialized_) {
    return mismatch("the shard is not initialised");
  } else if (c.kind == Kind::kUpdate) {
    if (!sized || c.version != version_ + 1) return mismatch("not the next update");
  } else if (c.version != version_) {
    return mismatch("a push taken at another version");
  }
  if (c.worker_id >= 0 && c.kind != Kind::kInitialize) {
    if (absl::Status s = CheckWorkerId(c.worker_id); !s.ok()) return mismatch(s.message());
  }
  if (absl::Status s = Apply(c, max_abs); !s.ok()) return mismatch(s.message());
  AnswerWaiters(&answers);
  return absl::OkStatus();
}

}  // namespace ps
