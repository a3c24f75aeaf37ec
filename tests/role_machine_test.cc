// The replica's role state machine without processes, sockets or clocks: every transition of
// server/replication/role_machine.h (and so of replica.h's "Roles and epochs"), driven by the
// peer's status, joins, the primary's stream and the time passed in; and the epoch file's rule.
#include "server/replication/role_machine.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "server/replication/epoch_file.h"
#include "tests/run_dir.h"

namespace ps {
namespace {

using Action = RoleMachine::Action;
using Role = RoleMachine::Role;

const absl::Time kStart = absl::FromUnixSeconds(1'000'000);
constexpr absl::Duration kFailover = absl::Seconds(1);
constexpr int64_t kPrimaryProcess = 41;  // shard incarnations
constexpr int64_t kOtherProcess = 42;

// A machine whose kept epochs are recorded (or refused, while `refuse` is set).
struct Machine {
  explicit Machine(int replica)
      : machine({/*shard_index=*/3, "peer:1", replica, kFailover}, [this](int64_t epoch) {
          if (refuse) return absl::UnavailableError("disk full");
          kept.push_back(epoch);
          return absl::OkStatus();
        }) {}
  std::vector<int64_t> kept;
  bool refuse = false;
  RoleMachine machine;
};

RoleMachine::Peer Unreached() { return RoleMachine::Peer(); }
RoleMachine::Peer PeerIs(Role role, int64_t epoch, int64_t incarnation = kPrimaryProcess,
                         bool caught_up = false) {
  return {true, role, epoch, incarnation, caught_up};
}

// Joins a primary of `incarnation` at `epoch` and follows it, heard from at `now`.
void Follow(RoleMachine& m, int64_t epoch, int64_t incarnation, absl::Time now) {
  ASSERT_EQ(m.Next(PeerIs(Role::kPrimary, epoch, incarnation), false), Action::kJoin);
  m.BeginFollow(incarnation);
  ASSERT_TRUE(m.CheckPrimaryEpoch(epoch).ok());
  ASSERT_TRUE(m.AcceptState(epoch).ok());
  m.Followed(incarnation, now);
}

TEST(RoleMachineTest, RoleNamesGoBothWays) {
  for (Role role : {Role::kJoining, Role::kBackup, Role::kPrimary, Role::kFenced}) {
    EXPECT_EQ(RoleMachine::RoleNamed(RoleMachine::RoleName(role)), role);
  }
  EXPECT_EQ(RoleMachine::RoleNamed("unknown"), Role::kJoining);
}

TEST(RoleMachineTest, ReplicaZeroStartsThePrimaryWhenNoPeerHasAModel) {
  for (const RoleMachine::Peer& peer : {Unreached(), PeerIs(Role::kJoining, 0)}) {
    Machine m(0);
    EXPECT_EQ(m.machine.role(), Role::kJoining);
    EXPECT_TRUE(m.machine.ShouldProbe(false));
    EXPECT_EQ(m.machine.Serving(false, kStart).code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(m.machine.Next(peer, false), Action::kStartedPrimary);
    EXPECT_EQ(m.machine.role(), Role::kPrimary);
    EXPECT_EQ(m.machine.epoch(), 1);
    EXPECT_EQ(m.kept, std::vector<int64_t>{1});  // kept before acting at it
    EXPECT_TRUE(m.machine.veteran());
    EXPECT_FALSE(m.machine.alone());
  }
}

TEST(RoleMachineTest, ReplicaOneNeverStartsAPrimary) {
  Machine m(1);
  EXPECT_EQ(m.machine.Next(Unreached(), false), Action::kWaitForPrimary);
  EXPECT_EQ(m.machine.Next(PeerIs(Role::kJoining, 0), false), Action::kWaitForPrimary);
  EXPECT_EQ(m.machine.role(), Role::kJoining);
  EXPECT_EQ(m.machine.epoch(), 0);
  EXPECT_TRUE(m.kept.empty());
}

TEST(RoleMachineTest, NoPrimaryStartsBesideAPeerThatIsABackup) {
  Machine m(0);
  // A backup that does not hold its primary's state cannot take over: wait.
  EXPECT_EQ(m.machine.Next(PeerIs(Role::kBackup, 1), false), Action::kWaitForPrimary);
  // One that does is asked to take over (then joined).
  EXPECT_EQ(m.machine.Next(PeerIs(Role::kBackup, 1, kPrimaryProcess, /*caught_up=*/true), false),
            Action::kAskToTakeOver);
  EXPECT_EQ(m.machine.role(), Role::kJoining);
  EXPECT_TRUE(m.kept.empty());
}

TEST(RoleMachineTest, AnEpochThatCannotBeKeptIsNotActedAt) {
  Machine m(0);
  m.refuse = true;
  EXPECT_EQ(m.machine.Next(Unreached(), false), Action::kNothing);
  EXPECT_EQ(m.machine.role(), Role::kJoining);
  EXPECT_EQ(m.machine.epoch(), 0);
  // Nor joined at.
  m.machine.BeginFollow(kPrimaryProcess);
  EXPECT_EQ(m.machine.AcceptState(2).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(m.machine.epoch(), 0);
  m.machine.EndFollow();
  EXPECT_EQ(m.machine.role(), Role::kJoining);
}

TEST(RoleMachineTest, AReplicaRestartedEmptyStartsNoPrimaryByItself) {
  const std::string file = NewRunDir("epoch") + "/epoch";
  EXPECT_EQ(*ReadEpochFile(file), 0);  // never written: a new replica
  ASSERT_TRUE(WriteEpochFile(file, 2).ok());
  absl::StatusOr<int64_t> epoch = ReadEpochFile(file);
  ASSERT_TRUE(epoch.ok());
  EXPECT_EQ(*epoch, 2);

  Machine m(0);
  m.machine.Resume(*epoch);
  EXPECT_TRUE(m.machine.veteran());
  EXPECT_EQ(m.machine.Next(Unreached(), false), Action::kWaitForPrimary);
  EXPECT_EQ(m.machine.Next(PeerIs(Role::kJoining, 0), false), Action::kWaitForPrimary);
  EXPECT_EQ(m.machine.role(), Role::kJoining);
  EXPECT_EQ(m.machine.epoch(), 2);
  EXPECT_TRUE(m.kept.empty());

  Machine fresh(0);
  fresh.machine.Resume(0);  // an epoch file that was never written
  EXPECT_FALSE(fresh.machine.veteran());
  EXPECT_EQ(fresh.machine.Next(Unreached(), false), Action::kStartedPrimary);
}

TEST(RoleMachineTest, AnEpochFileThatHoldsNoEpochIsAnError) {
  const std::string file = NewRunDir("epoch") + "/epoch";
  {
    std::ofstream out(file);
    out << "not a number\n";
  }
  EXPECT_EQ(ReadEpochFile(file).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteEpochFile(NewRunDir("epoch") + "/missing/epoch", 1).code(),
            absl::StatusCode::kUnavailable);
}

TEST(RoleMachineTest, AJoiningReplicaBecomesTheBackupOnceTheStateIsInPlace) {
  Machine m(1);
  EXPECT_EQ(m.machine.Next(PeerIs(Role::kPrimary, 1), false), Action::kJoin);
  m.machine.BeginFollow(kPrimaryProcess);
  EXPECT_TRUE(m.machine.following());
  EXPECT_FALSE(m.machine.Follows(1));  // the state is still coming
  EXPECT_TRUE(m.machine.AcceptState(1).ok());
  EXPECT_EQ(m.kept, std::vector<int64_t>{1});
  m.machine.Followed(kPrimaryProcess, kStart);
  EXPECT_EQ(m.machine.role(), Role::kBackup);
  EXPECT_TRUE(m.machine.caught_up());
  EXPECT_TRUE(m.machine.Follows(1));
  EXPECT_FALSE(m.machine.Follows(2));  // another epoch's changes
  absl::Status serving = m.machine.Serving(false, kStart + absl::Milliseconds(300));
  EXPECT_EQ(serving.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(serving.message().find("backup"), absl::string_view::npos) << serving;
  EXPECT_NE(serving.message().find("300ms"), absl::string_view::npos) << serving;
}

TEST(RoleMachineTest, ASilentPrimaryIsTakenOverAfterTheFailoverTimeAtAHigherEpoch) {
  Machine m(1);
  Follow(m.machine, 1, kPrimaryProcess, kStart);
  // Heard from: the silence starts again.
  m.machine.Heard(kStart + absl::Milliseconds(500));
  EXPECT_FALSE(m.machine.TakeOver(kStart + kFailover));
  EXPECT_EQ(m.machine.role(), Role::kBackup);
  EXPECT_FALSE(
      m.machine.TakeOver(kStart + absl::Milliseconds(500) + kFailover - absl::Milliseconds(1)));
  EXPECT_TRUE(m.machine.TakeOver(kStart + absl::Milliseconds(500) + kFailover));
  EXPECT_EQ(m.machine.role(), Role::kPrimary);
  EXPECT_EQ(m.machine.epoch(), 2);
  EXPECT_EQ(m.kept, (std::vector<int64_t>{1, 2}));
  // Alone: it serves and acknowledges without a backup, and probes no one.
  EXPECT_TRUE(m.machine.alone());
  EXPECT_TRUE(m.machine.Serving(false, kStart).ok());
  EXPECT_FALSE(m.machine.ShouldProbe(false));
  EXPECT_FALSE(m.machine.TakeOver(kStart + absl::Hours(1)));  // once
  // The stream of the old primary is no longer this replica's: its state stays.
  EXPECT_FALSE(m.machine.Follows(1));
  EXPECT_EQ(m.machine.AcceptState(1).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(m.machine.epoch(), 2);
  // Until a backup joins, after which every change waits for it again.
  EXPECT_TRUE(m.machine.AcceptBackup().ok());
  m.machine.BackupAttached();
  EXPECT_FALSE(m.machine.alone());
  EXPECT_TRUE(m.machine.Serving(true, kStart).ok());
  EXPECT_EQ(m.machine.Serving(false, kStart).code(), absl::StatusCode::kUnavailable);
}

TEST(RoleMachineTest, NoTakeoverWithoutThePrimarysStateOrDuringATransfer) {
  Machine never(1);  // joining, never caught up
  EXPECT_FALSE(never.machine.TakeOver(kStart + absl::Hours(1)));

  Machine m(1);
  Follow(m.machine, 1, kPrimaryProcess, kStart);
  m.machine.EndFollow();
  // The same primary again: still caught up, but a state transfer is coming.
  m.machine.BeginFollow(kPrimaryProcess);
  EXPECT_TRUE(m.machine.caught_up());
  EXPECT_FALSE(m.machine.TakeOver(kStart + absl::Hours(1)));
  m.machine.EndFollow();
  EXPECT_TRUE(m.machine.TakeOver(kStart + absl::Hours(1)));

  Machine other(1);
  Follow(other.machine, 1, kPrimaryProcess, kStart);
  other.machine.EndFollow();
  // Another primary process: the state held is not its, and is replaced by its transfer.
  other.machine.BeginFollow(kOtherProcess);
  EXPECT_FALSE(other.machine.caught_up());
  other.machine.EndFollow();
  EXPECT_FALSE(other.machine.TakeOver(kStart + absl::Hours(1)));
}

TEST(RoleMachineTest, ABackupWhoseStreamEndedWaitsForTheFailoverTimeOrItsPrimary) {
  Machine m(1);
  Follow(m.machine, 1, kPrimaryProcess, kStart);
  m.machine.EndFollow();
  EXPECT_FALSE(m.machine.following());
  EXPECT_TRUE(m.machine.ShouldProbe(false));
  EXPECT_EQ(m.machine.Next(Unreached(), false), Action::kNothing);
  EXPECT_EQ(m.machine.Next(PeerIs(Role::kJoining, 0), false), Action::kNothing);
  // Its primary again: joined again.
  EXPECT_EQ(m.machine.Next(PeerIs(Role::kPrimary, 1), false), Action::kJoin);
  EXPECT_EQ(m.machine.role(), Role::kBackup);
}

TEST(RoleMachineTest, ABackupThatComesBackJoinsOnlyItsPrimaryOrANewerOne) {
  Machine m(1);
  Follow(m.machine, 2, kPrimaryProcess, kStart);
  m.machine.EndFollow();
  // Another process at the same epoch lacks the state this backup holds.
  EXPECT_EQ(m.machine.Next(PeerIs(Role::kPrimary, 2, kOtherProcess), false),
            Action::kNotTheFollowed);
  // The one it followed, or one at a higher epoch (which took over meanwhile), it joins.
  EXPECT_EQ(m.machine.Next(PeerIs(Role::kPrimary, 2, kPrimaryProcess), false), Action::kJoin);
  EXPECT_EQ(m.machine.Next(PeerIs(Role::kPrimary, 3, kOtherProcess), false), Action::kJoin);
  m.machine.BeginFollow(kOtherProcess);
  EXPECT_TRUE(m.machine.CheckPrimaryEpoch(3).ok());
  EXPECT_TRUE(m.machine.AcceptState(3).ok());
  m.machine.Followed(kOtherProcess, kStart);
  EXPECT_EQ(m.machine.epoch(), 3);
  EXPECT_TRUE(m.machine.Follows(3));
}

TEST(RoleMachineTest, AnOlderPrimaryIsNeverJoinedButFenced) {
  // A replica restarted after a takeover (epoch 2 in its file) finds the old primary (epoch 1).
  Machine restarted(0);
  restarted.machine.Resume(2);
  Machine stale(0);
  ASSERT_EQ(stale.machine.Next(Unreached(), false), Action::kStartedPrimary);  // epoch 1
  ASSERT_EQ(restarted.machine.Next(PeerIs(Role::kPrimary, stale.machine.epoch()), false),
            Action::kJoin);
  // Its join carries epoch 2: the stale primary is fenced and refuses it...
  EXPECT_TRUE(stale.machine.FenceIfOlderThan(restarted.machine.epoch()));
  EXPECT_EQ(stale.machine.role(), Role::kFenced);
  EXPECT_EQ(stale.machine.AcceptBackup().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.machine.fenced_reason().find("epoch 2"), std::string::npos);
  EXPECT_EQ(stale.machine.Serving(true, kStart).message(), stale.machine.fenced_reason());
  EXPECT_FALSE(stale.machine.ShouldProbe(false));
  EXPECT_FALSE(stale.machine.FenceIfOlderThan(3));  // fenced once, for the first reason
  // ...and its state, were it sent, is refused.
  restarted.machine.BeginFollow(kPrimaryProcess);
  EXPECT_EQ(restarted.machine.CheckPrimaryEpoch(1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(restarted.machine.CheckPrimaryEpoch(2).ok());
}

TEST(RoleMachineTest, ABackupAtTheSameOrAnOlderEpochJoinsThePrimary) {
  Machine m(0);
  ASSERT_EQ(m.machine.Next(Unreached(), false), Action::kStartedPrimary);
  EXPECT_FALSE(m.machine.FenceIfOlderThan(0));
  EXPECT_FALSE(m.machine.FenceIfOlderThan(1));
  EXPECT_TRUE(m.machine.AcceptBackup().ok());
  Machine joining(1);
  EXPECT_EQ(joining.machine.AcceptBackup().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(RoleMachineTest, ALonePrimaryThatSeesItsReplacementIsFenced) {
  Machine m(0);
  ASSERT_EQ(m.machine.Next(Unreached(), false), Action::kStartedPrimary);  // epoch 1
  // With a backup it asks no one.
  EXPECT_FALSE(m.machine.ShouldProbe(true));
  EXPECT_EQ(m.machine.Next(PeerIs(Role::kPrimary, 5), true), Action::kNothing);
  // Without one it waits, unless its peer took over at a higher epoch.
  EXPECT_TRUE(m.machine.ShouldProbe(false));
  EXPECT_EQ(m.machine.Next(Unreached(), false), Action::kWaitForBackup);
  EXPECT_EQ(m.machine.Next(PeerIs(Role::kJoining, 0), false), Action::kWaitForBackup);
  EXPECT_EQ(m.machine.Next(PeerIs(Role::kPrimary, 1), false), Action::kWaitForBackup);
  EXPECT_EQ(m.machine.Next(PeerIs(Role::kPrimary, 2), false), Action::kFenced);
  EXPECT_EQ(m.machine.role(), Role::kFenced);
  EXPECT_NE(m.machine.fenced_reason().find("took over as primary at epoch 2"), std::string::npos)
      << m.machine.fenced_reason();
  // For good: no probe, no action, no takeover, no serving.
  EXPECT_FALSE(m.machine.ShouldProbe(false));
  EXPECT_EQ(m.machine.Next(Unreached(), false), Action::kNothing);
  EXPECT_FALSE(m.machine.TakeOver(kStart + absl::Hours(1)));
  EXPECT_EQ(m.machine.AcceptState(3).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(m.machine.Serving(true, kStart).code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(m.machine.Fence("again"));
}

}  // namespace
}  // namespace ps
