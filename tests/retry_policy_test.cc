// What the client does after an attempt (client/retry_policy.h): each kind of end and status.
#include "client/retry_policy.h"

#include <gtest/gtest.h>

#include "transport/grpc_status.h"

namespace ps {
namespace {

using Kind = AttemptEnd::Kind;

AttemptEnd Answer(absl::StatusCode code) { return AttemptEnd::Answered(absl::Status(code, "x")); }

TEST(RetryPolicyTest, TheShardsSignalsAreTypedWhereItsAnswerArrives) {
  EXPECT_EQ(AttemptEnd::FromShard(ShardRestartedStatus("r")).kind, Kind::kShardRestarted);
  EXPECT_EQ(AttemptEnd::FromShard(SharedMemoryLostStatus("s")).kind, Kind::kPathLost);
  EXPECT_EQ(AttemptEnd::FromShard(DataPlaneLostStatus("d")).kind, Kind::kPathLost);
  // The same code without the detail is a plain answer.
  AttemptEnd plain =
      AttemptEnd::FromShard(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no model"));
  EXPECT_EQ(plain.kind, Kind::kAnswered);
  EXPECT_EQ(plain.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(plain.status.message(), "no model");
  EXPECT_TRUE(AttemptEnd::FromShard(grpc::Status::OK).ok());
}

TEST(RetryPolicyTest, EachEndLeadsToOneAction) {
  RetryFacts facts;
  EXPECT_EQ(DecideRetry(AttemptEnd::Answered(absl::OkStatus()), facts), RetryAction::kDone);
  EXPECT_EQ(DecideRetry(AttemptEnd::FromShard(ShardRestartedStatus("r")), facts),
            RetryAction::kRegisterAgain);
  EXPECT_EQ(DecideRetry(AttemptEnd::PathLost(absl::UnavailableError("cut")), facts),
            RetryAction::kAgainNow);
  EXPECT_EQ(DecideRetry(Answer(absl::StatusCode::kAborted), facts), RetryAction::kAgainNow);
  EXPECT_EQ(DecideRetry(Answer(absl::StatusCode::kUnavailable), facts), RetryAction::kFailOver);
  EXPECT_EQ(DecideRetry(Answer(absl::StatusCode::kDeadlineExceeded), facts),
            RetryAction::kFailOver);
  // A shard shutting down cancels what it did not finish: as transient as UNAVAILABLE.
  EXPECT_EQ(DecideRetry(Answer(absl::StatusCode::kCancelled), facts), RetryAction::kFailOver);
  // A busy replica is alive and serving: no failover.
  EXPECT_EQ(DecideRetry(Answer(absl::StatusCode::kResourceExhausted), facts),
            RetryAction::kBackOff);
  for (absl::StatusCode code :
       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kFailedPrecondition,
        absl::StatusCode::kPermissionDenied, absl::StatusCode::kUnauthenticated,
        absl::StatusCode::kDataLoss, absl::StatusCode::kInternal, absl::StatusCode::kUnknown}) {
    EXPECT_EQ(DecideRetry(Answer(code), facts), RetryAction::kFail) << code;
  }
}

TEST(RetryPolicyTest, WhatThisClientEndedItselfIsNotRetried) {
  RetryFacts facts;
  EXPECT_EQ(DecideRetry(AttemptEnd::DroppedHere(), facts), RetryAction::kFail);
  EXPECT_EQ(AttemptEnd::DroppedHere().status.code(), absl::StatusCode::kCancelled);
  // ABORTED that is not the shard holding the call back: the caller used the values.
  EXPECT_EQ(DecideRetry(AttemptEnd::ValuesUsed(), facts), RetryAction::kFail);
  EXPECT_EQ(AttemptEnd::ValuesUsed().status.code(), absl::StatusCode::kAborted);
  facts.cancelled_here = true;
  EXPECT_EQ(DecideRetry(Answer(absl::StatusCode::kCancelled), facts), RetryAction::kFail);
  // Cancelled here, a shard's UNAVAILABLE still fails over (the loop stops at its backoff).
  EXPECT_EQ(DecideRetry(Answer(absl::StatusCode::kUnavailable), facts), RetryAction::kFailOver);
}

TEST(RetryPolicyTest, RegisteringAgainAndLostPathsAreBounded) {
  RetryFacts facts;
  facts.reregistrations = 3;
  // A shard that keeps saying it restarted after registering again is not one to use.
  EXPECT_EQ(DecideRetry(AttemptEnd::FromShard(ShardRestartedStatus("r")), facts),
            RetryAction::kFail);
  facts.paths_lost = 2;
  EXPECT_EQ(DecideRetry(AttemptEnd::PathLost(absl::FailedPreconditionError("lost")), facts),
            RetryAction::kFail);
}

TEST(RetryPolicyTest, ACallMadeOnceIsNotRepeatedButStillRegistersAgain) {
  RetryFacts facts;
  facts.retry = false;  // a heartbeat, a leave
  EXPECT_EQ(DecideRetry(Answer(absl::StatusCode::kUnavailable), facts), RetryAction::kFail);
  EXPECT_EQ(DecideRetry(Answer(absl::StatusCode::kAborted), facts), RetryAction::kFail);
  EXPECT_EQ(DecideRetry(AttemptEnd::FromShard(ShardRestartedStatus("r")), facts),
            RetryAction::kRegisterAgain);
  EXPECT_EQ(DecideRetry(AttemptEnd::PathLost(absl::UnavailableError("cut")), facts),
            RetryAction::kAgainNow);
}

}  // namespace
}  // namespace ps
