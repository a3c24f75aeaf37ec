// The role a replica plays and the epoch it plays it at (see server/replication/replica.h, "Roles
// and epochs"), as a state machine over what the replica learns: its peer's status, the join of a
// backup, the primary's stream, and the time that passed since the primary was last heard from.
// It decides when to serve, fence, take over and join; Replica does the talking (probes, streams,
// logs) and passes the time in. No threads, sockets or clocks of its own.
//
// Thread-compatible (Replica keeps it under its lock), except role(), which may be read from any
// thread at any time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ps {

class RoleMachine {
 public:
  enum class Role { kJoining, kBackup, kPrimary, kFenced };
  static const char* RoleName(Role role);
  // The name of RoleName's result: kJoining for a name not known.
  static Role RoleNamed(absl::string_view name);

  struct Options {
    int shard_index = 0;  // for messages
    std::string peer;     // the other replica's address, for messages
    int replica = 0;      // 0 starts as the primary when its peer has no model to give
    absl::Duration failover = absl::Seconds(1);
  };
  // Makes `epoch` durable before the machine moves to it (the epoch file); an error keeps the
  // machine where it was.
  using KeepEpoch = std::function<absl::Status(int64_t epoch)>;

  // A new replica, joining at epoch 0.
  RoleMachine(Options options, KeepEpoch keep_epoch);

  // The epoch the epoch file held when this process started: a replica that took part before
  // (epoch > 0) never starts a primary by itself.
  void Resume(int64_t epoch);

  // What a probe of the peer found.
  struct Peer {
    bool reached = false;  // false: the rest is not known
    Role role = Role::kJoining;
    int64_t epoch = 0;
    int64_t incarnation = 0;  // its shard process's
    bool caught_up = false;   // a backup that holds its primary's state
  };
  // What the replica should do after probing its peer (Next).
  enum class Action {
    kNothing,         // serving, following, or waiting for the failover time
    kFenced,          // a lone primary found its replacement: fenced now (fenced_reason())
    kWaitForBackup,   // a lone primary: no push is acknowledged until a backup joins
    kJoin,            // join the peer, a primary (BeginFollow, then Followed)
    kNotTheFollowed,  // the peer is a primary at this epoch that this backup did not follow
    kAskToTakeOver,   // the peer is a caught-up backup whose primary is gone: ask it to take over
    kStartedPrimary,  // no primary anywhere: this replica became it (epoch raised)
    kWaitForPrimary,  // nothing to join yet, and not this replica's to start
  };

  // Whether the replica should probe its peer now, given whether a backup is attached to it:
  // joining, a backup whose stream ended, or a primary without a backup (replaced, perhaps).
  bool ShouldProbe(bool backup_attached) const;
  // Decides on what a probe found (see Action); the fence and the start of a primary happen here.
  Action Next(const Peer& peer, bool backup_attached);

  // A backup takes over when it holds its primary's state, receives no state transfer, and its
  // primary has been silent for the failover time at `now`: raises the epoch and serves alone.
  // Returns whether it did.
  bool TakeOver(absl::Time now);
  // Fenced for good, for `reason`; returns false if it was already.
  bool Fence(std::string reason);

  // OK unless a primary at `epoch` is older than this replica's: FAILED_PRECONDITION then (its
  // state misses the pushes acknowledged since; the join, carrying this replica's epoch, fences
  // it instead).
  absl::Status CheckPrimaryEpoch(int64_t epoch) const;
  // Following the primary of shard process `incarnation`: a state transfer starts (no takeover
  // until it ends). A backup that held another primary's state no longer counts as caught up.
  void BeginFollow(int64_t incarnation);
  // The state transfer of a primary at `epoch` arrived: OK to put it in place (the epoch is kept
  // already); CANCELLED if this replica took over or was fenced meanwhile, UNAVAILABLE if the
  // epoch cannot be kept. Either way the transfer is over.
  absl::Status AcceptState(int64_t epoch);
  // The state is in place: a caught-up backup of primary `incarnation`, heard from at `now`.
  void Followed(int64_t incarnation, absl::Time now);
  // The stream from the primary ended.
  void EndFollow();
  // Something came from the primary.
  void Heard(absl::Time now) { last_heard_ = now; }
  // Whether changes of a primary at `epoch` are this backup's to apply now.
  bool Follows(int64_t epoch) const {
    return role_ == Role::kBackup && !transferring_ && epoch == epoch_;
  }

  // A backup that knows `epoch` joins this replica: a replica at an older one is fenced for good.
  // Returns whether it was fenced now.
  bool FenceIfOlderThan(int64_t epoch);
  // OK if this replica is the primary, which a backup may join; FAILED_PRECONDITION naming its
  // role otherwise.
  absl::Status AcceptBackup() const;
  // A backup is attached: a primary that served alone waits for it from now on.
  void BackupAttached() { alone_ = false; }

  // OK if this replica serves clients now, given whether a backup is attached; UNAVAILABLE,
  // saying why, otherwise.
  absl::Status Serving(bool backup_attached, absl::Time now) const;

  Role role() const { return role_.load(); }
  int64_t epoch() const { return epoch_; }
  // A primary that took over and no backup joined since: acknowledges without one.
  bool alone() const { return alone_; }
  // A backup that holds the state of the primary it follows (or followed).
  bool caught_up() const { return caught_up_; }
  // The backup's stream from its primary is open (BeginFollow to EndFollow).
  bool following() const { return following_; }
  // Took part in the job before (an epoch kept): never starts a primary itself.
  bool veteran() const { return veteran_; }
  absl::Duration silence(absl::Time now) const { return now - last_heard_; }
  const std::string& fenced_reason() const { return fenced_reason_; }

 private:
  // Moves to `epoch` once kept; false (logged) if it could not be.
  bool SetEpoch(int64_t epoch);

  const Options options_;
  const KeepEpoch keep_epoch_;
  std::atomic<Role> role_{Role::kJoining};
  int64_t epoch_ = 0;
  bool alone_ = false;
  bool caught_up_ = false;
  int64_t followed_ = 0;  // the incarnation of the primary whose state a caught-up backup holds
  absl::Time last_heard_ = absl::InfinitePast();
  bool following_ = false;
  bool transferring_ = false;  // a state transfer is being received: its end replaces the state
  bool veteran_ = false;
  std::string fenced_reason_;
};

}  // namespace ps
