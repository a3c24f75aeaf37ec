// The attempts of a client's calls to its shards, and its one retry loop. Each attempt gets a
// fresh context (the attempt's deadline, the token every call carries), tracked so that
// CancelAll reaches it; a failed one is repeated, registered again, moved to the shard's other
// replica or given up as client/retry_policy.h decides, with backoff (50 ms doubling to
// kMaxReconnectBackoffMs, cut short when the shard's channel connects again) within
// ClientOptions::retry_for (connect_for at a shard never reached), logging the first failure and
// then a line per kRetryNoteInterval. A replica never reached is probed once so that settings
// that do not fit (TLS, an address that is no shard) fail the call at once, named
// (connection_probe.h).
//
// Calls belong to a generation: CancelAll cancels the attempts in progress and ends the retries
// of every call started before it; Close, of every call. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/retry_policy.h"
#include "client/shard_session.h"

namespace ps {

class ShardAttempts {
 public:
  // A call that keeps failing logs its first failure, then one line per this interval.
  static constexpr absl::Duration kRetryNoteInterval = absl::Seconds(10);

  using ShardFn = std::function<AttemptEnd(int shard, grpc::ClientContext*)>;
  // `sessions` and `options` outlive this; `resume_sequence()` is the sequence a worker that
  // registers again with a restarted shard resumes at (-1: an observer's).
  ShardAttempts(const std::vector<std::unique_ptr<ShardSession>>* sessions,
                const ClientOptions* options, std::function<int64_t()> resume_sequence);

  // The generation calls started now belong to.
  int64_t generation();
  // Whether this client cancelled the calls of `generation` (CancelAll, Close). A CANCELLED it
  // did not cause came from the shard: one shutting down cancels the calls it did not finish.
  bool CancelledHere(int64_t generation);

  // One attempt of fn at `shard` with a fresh context (deadline `timeout`, token); CANCELLED if
  // `generation` was cancelled already.
  AttemptEnd Attempt(int shard, const ShardFn& fn, int64_t generation, absl::Duration timeout);
  // The attempts of a session's own calls (registering, attaching paths) as calls of
  // `generation`, each an attempt of the client's time (ClientOptions::rpc_timeout).
  ShardSession::Attempter AttempterFor(int shard, int64_t generation);
  // `shard`'s attempts of a call started in `generation` until one succeeds or the call fails;
  // the error names the shard and its address. `retry` false: one attempt (a heartbeat).
  // `budget_from(shard)`, if given: a time from which the retry budget counts when later than
  // the first attempt (a part sent as backward makes it: once backward finished it).
  absl::Status Retry(int shard, const ShardFn& fn, bool retry, absl::Duration timeout,
                     int64_t generation, const std::function<absl::Time(int)>& budget_from);

  // Cancels the attempts in progress and ends the retries of the calls started so far.
  void CancelAll();
  // The same, for every later call too.
  void Close();

 private:
  bool Track(grpc::ClientContext* context, int64_t generation);
  void Untrack(grpc::ClientContext* context);
  // Registers again with `shard`, whose registration's shard incarnation was `stale`.
  AttemptEnd Reregister(int shard, int64_t stale, int64_t generation);
  // After a failed attempt at `called` (`end`, which `not_connected` says could not connect):
  // probes a replica never reached, once per call (`probed` keeps the finding); a mismatch of
  // TLS settings, which no retry heals, fails the call at once (FAILED_PRECONDITION naming it).
  absl::Status ProbeUnreached(int shard, ShardSession::Replica& called, const AttemptEnd& end,
                              bool not_connected, std::optional<ProbeFinding>* probed);
  // Logs that `shard`'s call failed at `called` (`end`) and is retried for up to `budget` in
  // all, unless a line was logged less than kRetryNoteInterval ago (`next_note`: when the next
  // may be).
  static void NoteRetry(int shard, const ShardSession::Replica& called, const AttemptEnd& end,
                        absl::Duration budget, absl::Time* next_note);
  // Waits `backoff`, cut short (to at least 50 ms) when the shard's channel, down meanwhile,
  // connects again (a shard back from a restart is used at once). True if the call was
  // cancelled meanwhile (checked every 50 ms).
  bool BackOff(int shard, absl::Duration backoff, int64_t generation);
  // What a failed attempt at `called` says, for the call's error: the probe's finding where it
  // explains a failure to connect, how long retries went on.
  static std::string Failure(int shard, const ShardSession::Replica& called,
                             const AttemptEnd& end, const std::optional<ProbeFinding>& probed,
                             bool not_connected, absl::Duration retried);

  const std::vector<std::unique_ptr<ShardSession>>& sessions_;
  const ClientOptions& options_;
  const std::function<int64_t()> resume_sequence_;
  const std::string authorization_;  // the metadata value every call carries; "": none
  absl::Mutex mu_;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // incremented by CancelAll
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps
