// How one attempt at a shard's part of a call ended, and what the client does next: decided from
// the attempt's status code and a typed kind, never from message or detail strings. The shard's
// own signals (it restarted, a path it no longer serves) are typed once, where its answer arrives
// (AttemptEnd::FromShard). Plain functions, no state: unit-tested alone (retry_policy_test.cc).
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace ps {

struct AttemptEnd {
  enum class Kind {
    kAnswered,        // `status` is the shard's answer, or gRPC's failure to get one
    kNotTaken,        // (a path's) it cannot carry this part now: the next path is tried
    kShardRestarted,  // the shard is another process than the one this client registered with
    kPathLost,        // the path the tensor took (shared memory, data plane) stopped working and
                      // was dropped: the part may go again at once on the next path
    kDroppedHere,     // a held push's part this client dropped before it was final: CANCELLED
    kValuesUsed,      // a pull's part whose values the caller used before the attempt failed:
                      // ABORTED (a retry would rewrite them)
  };
  Kind kind = Kind::kAnswered;
  absl::Status status;

  bool ok() const { return kind == Kind::kAnswered && status.ok(); }
  static AttemptEnd Answered(absl::Status s) { return {Kind::kAnswered, std::move(s)}; }
  static AttemptEnd NotTaken() { return {Kind::kNotTaken, absl::OkStatus()}; }
  static AttemptEnd PathLost(absl::Status why) { return {Kind::kPathLost, std::move(why)}; }
  static AttemptEnd DroppedHere();
  static AttemptEnd ValuesUsed();
  // The shard's answer as it came over gRPC (or a data-plane call): its restart and lost-path
  // signals typed (transport/grpc_status.h), anything else kAnswered.
  static AttemptEnd FromShard(const grpc::Status& s);
};

enum class RetryAction {
  kDone,           // it succeeded
  kRegisterAgain,  // register with the restarted shard, then try again at once
  kAgainNow,       // again at once: on the next path (this one was lost), or asked again because
                   // the shard held the call back (a barrier, the SSP bound), which spends no
                   // retry budget
  kFailOver,       // a transient failure: at the shard's other replica (at once the first time)
                   // if it has one, else after the backoff
  kBackOff,        // a transient failure (a busy shard): again after the backoff
  kFail,           // the call fails with this status
};

// What the retry loop knows besides the attempt.
struct RetryFacts {
  bool retry = true;            // false: one attempt only (a heartbeat, a leave)
  bool cancelled_here = false;  // this client cancelled the call (CancelPending, Close)
  int reregistrations = 0;      // registrations again during this call so far (at most 3)
  int paths_lost = 0;           // paths lost during this call so far (at most 2)
};

RetryAction DecideRetry(const AttemptEnd& end, const RetryFacts& facts);

}  // namespace ps
