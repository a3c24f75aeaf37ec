#include "client/retry_policy.h"

#include "transport/grpc_status.h"

namespace ps {

AttemptEnd AttemptEnd::DroppedHere() {
  return {Kind::kDroppedHere,
          absl::CancelledError("the push was dropped before this shard's part was final")};
}

AttemptEnd AttemptEnd::ValuesUsed() {
  return {Kind::kValuesUsed,
          absl::AbortedError("values of this shard's part were used by the time its attempt "
                             "failed: a retry would rewrite them (compute again on a new pull)")};
}

AttemptEnd AttemptEnd::FromShard(const grpc::Status& s) {
  if (IsShardRestarted(s)) return {Kind::kShardRestarted, FromGrpcStatus(s)};
  if (IsSharedMemoryLost(s) || IsDataPlaneLost(s)) return PathLost(FromGrpcStatus(s));
  return Answered(FromGrpcStatus(s));
}

RetryAction DecideRetry(const AttemptEnd& end, const RetryFacts& facts) {
  using Kind = AttemptEnd::Kind;
  if (end.ok()) return RetryAction::kDone;
  if (end.kind == Kind::kShardRestarted && facts.reregistrations < 3) {
    return RetryAction::kRegisterAgain;
  }
  if (end.kind == Kind::kPathLost && facts.paths_lost < 2) return RetryAction::kAgainNow;
  const absl::StatusCode code = end.status.code();
  // A CANCELLED this client did not cause came from the shard: one shutting down (a restart, a
  // fenced primary) cancels what it did not finish, as transient as UNAVAILABLE.
  const bool cancelled = code == absl::StatusCode::kCancelled &&
                         (facts.cancelled_here || end.kind == Kind::kDroppedHere);
  if (!facts.retry || cancelled) return RetryAction::kFail;
  // Held back (a barrier, the SSP bound; bounded by the shard's progress timeout): the shard is
  // alive and waiting is the protocol.
  if (code == absl::StatusCode::kAborted && end.kind != Kind::kValuesUsed) {
    return RetryAction::kAgainNow;
  }
  switch (code) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
      return RetryAction::kFailOver;
    case absl::StatusCode::kResourceExhausted:  // a busy replica is alive and serving
      return RetryAction::kBackOff;
    default:
      return RetryAction::kFail;
  }
}

}  // namespace ps
