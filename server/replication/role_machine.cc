#include "server/replication/role_machine.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace ps {

const char* RoleMachine::RoleName(Role role) {
  switch (role) {
    case Role::kBackup:
      return "backup";
    case Role::kPrimary:
      return "primary";
    case Role::kFenced:
      return "fenced";
    default:
      return "joining";
  }
}

RoleMachine::Role RoleMachine::RoleNamed(absl::string_view name) {
  for (Role role : {Role::kBackup, Role::kPrimary, Role::kFenced}) {
    if (name == RoleName(role)) return role;
  }
  return Role::kJoining;
}

RoleMachine::RoleMachine(Options options, KeepEpoch keep_epoch)
    : options_(std::move(options)), keep_epoch_(std::move(keep_epoch)) {}

void RoleMachine::Resume(int64_t epoch) {
  epoch_ = epoch;
  veteran_ = epoch > 0;
}

bool RoleMachine::SetEpoch(int64_t epoch) {
  if (absl::Status s = keep_epoch_(epoch); !s.ok()) {
    PS_LOG(ERROR) << "not moving to epoch " << epoch << ": " << s.message();
    return false;
  }
  epoch_ = epoch;
  veteran_ = true;
  return true;
}

bool RoleMachine::ShouldProbe(bool backup_attached) const {
  switch (role_) {
    case Role::kPrimary:
      return !alone_ && !backup_attached;
    case Role::kFenced:
      return false;
    default:
      return true;
  }
}

RoleMachine::Action RoleMachine::Next(const Peer& peer, bool backup_attached) {
  const bool peer_primary = peer.reached && peer.role == Role::kPrimary;
  switch (role_) {
    case Role::kFenced:
      return Action::kNothing;
    case Role::kPrimary:  // without a backup: was it replaced?
      if (alone_ || backup_attached) return Action::kNothing;
      if (!peer_primary || peer.epoch <= epoch_) return Action::kWaitForBackup;
      Fence(absl::StrCat("shard ", options_.shard_index, ": the replica at ", options_.peer,
                         " took over as primary at epoch ", peer.epoch, " (this process had epoch ",
                         epoch_, "); this one is fenced and acknowledges nothing"));
      return Action::kFenced;
    default:  // joining, or a backup whose stream ended
      break;
  }
  if (peer_primary) {
    // At our epoch, only the primary we followed: another process there lacks our state. At an
    // older one, the join (carrying our epoch) fences it.
    const bool joinable = peer.epoch != epoch_ || !caught_up_ || peer.incarnation == followed_;
    return joinable ? Action::kJoin : Action::kNotTheFollowed;
  }
  if (role_ == Role::kBackup) return Action::kNothing;  // takes over once the silence is long
  if (peer.reached && peer.role == Role::kBackup && peer.caught_up) {
    return Action::kAskToTakeOver;  // its primary is gone, or soon will be
  }
  if (options_.replica != 0 || veteran_ || (peer.reached && peer.role != Role::kJoining)) {
    return Action::kWaitForPrimary;
  }
  if (!SetEpoch(epoch_ + 1)) return Action::kNothing;
  role_ = Role::kPrimary;
  return Action::kStartedPrimary;
}

bool RoleMachine::TakeOver(absl::Time now) {
  if (role_ != Role::kBackup || !caught_up_ || transferring_ || silence(now) < options_.failover ||
      !SetEpoch(epoch_ + 1)) {
    return false;
  }
  role_ = Role::kPrimary;
  alone_ = true;
  return true;
}

bool RoleMachine::Fence(std::string reason) {
  if (role_ == Role::kFenced) return false;
  role_ = Role::kFenced;
  fenced_reason_ = std::move(reason);
  return true;
}

bool RoleMachine::FenceIfOlderThan(int64_t epoch) {
  if (epoch <= epoch_) return false;
  return Fence(absl::StrCat("shard ", options_.shard_index, ": a backup knows epoch ", epoch,
                            ", newer than this primary's ", epoch_,
                            "; this one is fenced and acknowledges nothing"));
}

absl::Status RoleMachine::AcceptBackup() const {
  if (role_ == Role::kPrimary) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("this replica is ", RoleName(role_), ", not the primary"));
}

absl::Status RoleMachine::CheckPrimaryEpoch(int64_t epoch) const {
  if (epoch >= epoch_) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("the primary is at epoch ", epoch, ", older than this replica's ", epoch_));
}

void RoleMachine::BeginFollow(int64_t incarnation) {
  following_ = true;
  transferring_ = true;
  if (incarnation != followed_) caught_up_ = false;
}

absl::Status RoleMachine::AcceptState(int64_t epoch) {
  transferring_ = false;
  // What this replica acknowledged as primary must not be overwritten.
  if (role_ == Role::kPrimary || role_ == Role::kFenced) {
    return absl::CancelledError("no longer following");
  }
  if (!SetEpoch(epoch)) return absl::UnavailableError("cannot keep the epoch");
  return absl::OkStatus();
}

void RoleMachine::Followed(int64_t incarnation, absl::Time now) {
  role_ = Role::kBackup;
  caught_up_ = true;
  followed_ = incarnation;
  last_heard_ = now;
}

void RoleMachine::EndFollow() {
  following_ = false;
  transferring_ = false;
}

absl::Status RoleMachine::Serving(bool backup_attached, absl::Time now) const {
  switch (role_) {
    case Role::kPrimary:
      if (alone_ || backup_attached) return absl::OkStatus();
      return absl::UnavailableError(
          absl::StrCat("shard ", options_.shard_index, ": this primary (epoch ", epoch_,
                       ") has no backup following it and acknowledges nothing until one joins"));
    case Role::kBackup:
      return absl::UnavailableError(absl::StrCat(
          "shard ", options_.shard_index, ": this replica is the backup (its primary at ",
          options_.peer, " was heard from ", absl::FormatDuration(silence(now)), " ago)"));
    case Role::kFenced:
      return absl::UnavailableError(fenced_reason_);
    default:
      return absl::UnavailableError(absl::StrCat("shard ", options_.shard_index,
                                                 ": this replica is joining its primary at ",
                                                 options_.peer));
  }
}

}  // namespace ps
