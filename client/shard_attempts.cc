#include "client/shard_attempts.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "transport/channel_options.h"

namespace ps {

ShardAttempts::ShardAttempts(const std::vector<std::unique_ptr<ShardSession>>* sessions,
                             const ClientOptions* options,
                             std::function<int64_t()> resume_sequence)
    : sessions_(*sessions),
      options_(*options),
      resume_sequence_(std::move(resume_sequence)),
      authorization_(options->security.token.empty() ? ""
                                                     : BearerValue(options->security.token)) {}

ShardSession::Attempter ShardAttempts::AttempterFor(int shard, int64_t generation) {
  return [this, shard, generation](const std::function<AttemptEnd(grpc::ClientContext*)>& fn) {
    return Attempt(
        shard, [&](int, grpc::ClientContext* context) { return fn(context); }, generation,
        options_.rpc_timeout);
  };
}

bool ShardAttempts::Track(grpc::ClientContext* context, int64_t generation) {
  absl::MutexLock lock(&mu_);
  if (generation != generation_ || closed_) return false;
  in_flight_.insert(context);
  return true;
}

void ShardAttempts::Untrack(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  in_flight_.erase(context);
}

int64_t ShardAttempts::generation() {
  absl::MutexLock lock(&mu_);
  return generation_;
}

bool ShardAttempts::CancelledHere(int64_t generation) {
  absl::MutexLock lock(&mu_);
  return generation != generation_ || closed_;
}

AttemptEnd ShardAttempts::Attempt(int shard, const ShardFn& fn, int64_t generation,
                                        absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!authorization_.empty()) context.AddMetadata(kAuthorizationMetadata, authorization_);
  if (!Track(&context, generation)) {
    return AttemptEnd::Answered(absl::CancelledError("cancelled at shutdown"));
  }
  AttemptEnd end = fn(shard, &context);
  Untrack(&context);
  return end;
}

absl::Status ShardAttempts::Retry(int shard, const ShardFn& fn, bool retry,
                                        absl::Duration timeout, int64_t generation,
                                        const std::function<absl::Time(int)>& budget_from) {
  const absl::Time start = absl::Now();
  absl::Time give_up = start + options_.retry_for;
  // A shard never reached (a wrong address, or one not started yet) is given up sooner.
  const absl::Time unreached_give_up = start + std::min(options_.connect_for, options_.retry_for);
  absl::Time next_note = absl::InfinitePast();  // when a failure may be logged again
  absl::Duration backoff = absl::Milliseconds(50);
  // What a probe found about a replica this client has not reached yet (connection_probe.h).
  std::optional<ProbeFinding> probed;
  RetryFacts facts;
  facts.retry = retry;
  // With two replicas, a failure is tried at the other at once, then again after the backoff.
  bool switched_at_once = false;
  for (;;) {
    ShardSession& session = *sessions_[shard];
    const int64_t shard_incarnation = session.state().shard_incarnation;
    const int replica = session.current();
    ShardSession::Replica& called = session.replica(replica);
    AttemptEnd end = Attempt(shard, fn, generation, timeout);
    facts.cancelled_here = CancelledHere(generation);
    RetryAction action = DecideRetry(end, facts);
    if (action == RetryAction::kRegisterAgain) {
      ++facts.reregistrations;
      PS_LOG(WARNING) << "shard " << shard << " (" << called.address
                      << ") is another process than the one this client registered with: "
                         "registering again";
      end = Reregister(shard, shard_incarnation, generation);
      if (end.ok()) continue;
      action = DecideRetry(end, facts);
    }
    if (action == RetryAction::kDone) {
      called.reached.store(true, std::memory_order_relaxed);
      return absl::OkStatus();
    }
    if (action == RetryAction::kAgainNow) {
      // A path lost goes again on the next at once; a call held back is asked again at once,
      // without spending the retry budget.
      if (end.kind == AttemptEnd::Kind::kPathLost) {
        ++facts.paths_lost;
      } else {
        give_up = absl::Now() + options_.retry_for;
      }
      continue;
    }
    if (budget_from) give_up = std::max(give_up, budget_from(shard) + options_.retry_for);
    const absl::Time until = session.reached() ? give_up : std::min(give_up, unreached_give_up);
    const absl::StatusCode code = end.status.code();
    const bool not_connected =
        (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kUnknown ||
         code == absl::StatusCode::kDeadlineExceeded) &&
        called.rpc->channel().GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY;
    if (absl::Status s = ProbeUnreached(shard, called, end, not_connected, &probed); !s.ok()) {
      return s;
    }
    // A call that is not retried (a heartbeat) leaves the choice of replica to those that are.
    if (action == RetryAction::kFailOver && session.SwitchReplica(replica, end.status) &&
        !switched_at_once && absl::Now() < until) {
      switched_at_once = true;
      continue;
    }
    switched_at_once = false;
    bool stop = action == RetryAction::kFail || absl::Now() + backoff > until;
    if (!stop) {
      NoteRetry(shard, called, end, until - start, &next_note);
      stop = BackOff(shard, backoff, generation);
    }
    if (stop) {
      const bool out_of_time = action != RetryAction::kFail && absl::Now() + backoff > until;
      return absl::Status(code, Failure(shard, called, end, probed, not_connected,
                                        out_of_time ? absl::Now() - start : absl::ZeroDuration()));
    }
    // At most kMaxReconnectBackoffMs apart, like the channel's own attempts: a shard back from a
    // restart is used within about a second.
    backoff = std::min(backoff * 2, absl::Milliseconds(kMaxReconnectBackoffMs));
  }
}

absl::Status ShardAttempts::ProbeUnreached(int shard, ShardSession::Replica& called,
                                           const AttemptEnd& end, bool not_connected,
                                           std::optional<ProbeFinding>* probed) {
  // Could not connect, and never reached: the TLS settings may not fit, which no retry heals.
  if (*probed || !not_connected || called.reached.load(std::memory_order_relaxed)) {
    return absl::OkStatus();
  }
  *probed = sessions_[shard]->Probe(called, options_.security);
  if (!(*probed)->misconfigured) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("shard ", shard, " (", called.address,
                                                    "): ", (*probed)->cause,
                                                    " [gRPC: ", end.status.message(), "]"));
}

void ShardAttempts::NoteRetry(int shard, const ShardSession::Replica& called, const AttemptEnd& end,
                              absl::Duration budget, absl::Time* next_note) {
  const absl::Time now = absl::Now();
  if (now < *next_note) return;
  *next_note = now + kRetryNoteInterval;
  PS_LOG(WARNING) << "shard " << shard << " (" << called.address << "): " << end.status.message()
                  << "; retrying for up to "
                  << absl::FormatDuration(absl::Trunc(budget, absl::Seconds(1)));
}

bool ShardAttempts::BackOff(int shard, absl::Duration backoff, int64_t generation) {
  // Waits up to `d`; true if CancelPending was called meanwhile.
  auto cancelled_within = [&](absl::Duration d) {
    absl::MutexLock lock(&mu_);
    auto changed = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return generation_ != generation; };
    return mu_.AwaitWithTimeout(absl::Condition(&changed), d);
  };
  grpc::Channel& channel = sessions_[shard]->current_replica().rpc->channel();
  if (channel.GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY) {
    return cancelled_within(backoff);
  }
  const absl::Duration slice = absl::Milliseconds(50);
  for (absl::Time end = absl::Now() + backoff; absl::Now() < end;) {
    if (cancelled_within(absl::ZeroDuration())) return true;
    if (channel.WaitForConnected(absl::ToChronoTime(std::min(end, absl::Now() + slice)))) {
      return cancelled_within(slice);  // a shard that drops every call is not hammered
    }
  }
  return cancelled_within(absl::ZeroDuration());
}

std::string ShardAttempts::Failure(int shard, const ShardSession::Replica& called,
                                         const AttemptEnd& end,
                                         const std::optional<ProbeFinding>& probed,
                                         bool not_connected, absl::Duration retried) {
  // A call that kept failing says for how long, and what the probe found.
  const std::string tried =
      retried > absl::ZeroDuration()
          ? absl::StrCat(" (still failing after ",
                         absl::FormatDuration(absl::Trunc(retried, absl::Milliseconds(100))),
                         " of retries; the client's limit: --retry_seconds)")
          : "";
  // What the probe found explains this failure only if it is still one to connect.
  const bool found = probed && !probed->cause.empty() && not_connected;
  return absl::StrCat("shard ", shard, " (", called.address,
                      "): ", found ? probed->cause : end.status.message(), tried,
                      found ? absl::StrCat(" [gRPC: ", end.status.message(), "]") : "");
}

AttemptEnd ShardAttempts::Reregister(int shard, int64_t stale, int64_t generation) {
  return sessions_[shard]->Reregister(stale, resume_sequence_(), AttempterFor(shard, generation));
}

void ShardAttempts::CancelAll() {
  absl::MutexLock lock(&mu_);
  ++generation_;
  for (grpc::ClientContext* c : in_flight_) c->TryCancel();
}

void ShardAttempts::Close() {
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  CancelAll();
}

}  // namespace ps
