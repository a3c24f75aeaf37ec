// A worker's side of easgd and local SGD (common/consistency_spec.h): when it trades its local
// model (LocalModel) with the centre the shards hold, and how. Written once, for the C++ worker
// (trainer/training.cc) and, through the C API (capi/paramserver_c.h), for Python's
// DistributedModel:
//   local:H   each period of H steps starts from the centre (pulled into the model) and ends
//             with a push of the model's change since (sequence: the period's last step; the
//             run's last step ends a period too); the shards average a round of them.
//   easgd:T   before every T-th step: pulls the centre, diff = alpha (x - centre), x -= diff, and
//             pushes diff (sequence: the step), which the shards add to the centre. alpha is the
//             shards' (the consistency text they register clients with names it).
// A worker starting, or restarted, first pulls the centre into its model.
//
// Use: StartBeforeStep(step) before computing a step and StartAfterStep(step, last) after its
// local update, each followed by Wait until it returns a status (or BeforeStep / AfterStep, which
// do both); most steps exchange nothing. Wait takes a timeout so that a caller can stay
// responsive while a pull waits for a round to close.
//
// Not thread-safe: one worker's exchange, on one thread, which is also the one its client's
// pushes start from (ShardedClient's rule). Destroyed mid-exchange, it waits for the call in
// flight (CANCELLED by the client's CancelPending or Close, if need be).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/local_model.h"
#include "client/sharded_client.h"
#include "common/consistency_spec.h"

namespace ps {

class LocalExchange {
 public:
  struct Hooks {
    // Run before a pull or a push starts (a worker's delay injections); an error ends the
    // exchange with it.
    std::function<absl::Status()> before_pull, before_push;
  };
  // What the last exchange started did: a pull and a push that ended (well or not) and how long
  // each took from its start.
  struct Exchanged {
    bool pulled = false, pushed = false;
    absl::Duration pull_time, push_time;
    ShardedClient::PushSummary push;  // once a push succeeded
  };

  // The exchange of `model` (total_params values) with `client`'s shards, by the consistency
  // model they registered it with. REQUIRES: `client` registered, and it and `model` outlive
  // this. FAILED_PRECONDITION when the shards run no local models (async, ssp, sync) or name no
  // alpha for easgd; INVALID_ARGUMENT for a model of another size.
  static absl::StatusOr<std::unique_ptr<LocalExchange>> Create(ShardedClient* client,
                                                               LocalModel* model, Hooks hooks = {});

  const ConsistencySpec& spec() const { return spec_; }

  // Starts the exchange due before step `step` is computed: the first exchange, whatever the
  // step, pulls the centre into the model; later, local:H pulls it at a period's start
  // (step % H == 0), easgd:T pulls it and pushes the elastic difference at step % T == 0. OK when
  // started or nothing is due; else before_pull's error, or FAILED_PRECONDITION while the last
  // exchange started is still in progress (Wait has not returned its status).
  absl::Status StartBeforeStep(int64_t step);
  // Starts the exchange due after step `step`'s local update, `last` when no step follows it:
  // local:H pushes the model's change at a period's end ((step + 1) % H == 0, or `last`); easgd,
  // nothing. OK when started or nothing is due; else before_push's error, or FAILED_PRECONDITION as
  // above.
  absl::Status StartAfterStep(int64_t step, bool last);
  // Waits up to `timeout` for the exchange started: nullopt while it goes on, else how it ended
  // (OK too when nothing was started): the pull's or the push's error (failed_call() says which),
  // or before_push's.
  std::optional<absl::Status> Wait(absl::Duration timeout);
  // Start...Step, then Wait until it ended.
  absl::Status BeforeStep(int64_t step);
  absl::Status AfterStep(int64_t step, bool last);

  // Of the last exchange started.
  const Exchanged& exchanged() const { return exchanged_; }
  // "pull" or "push": the call an exchange failed in (meaningful once Wait returned an error).
  const char* failed_call() const { return failed_call_; }

 private:
  LocalExchange(ShardedClient* client, LocalModel* model, ConsistencySpec spec, Hooks hooks);
  // FAILED_PRECONDITION while a call of the last exchange is in flight.
  absl::Status CheckIdle() const;
  // Starts a pull into the model, or, for easgd's elastic exchange, into the centre.
  absl::Status StartPull(bool elastic);
  // Starts the push of out_ (sequence: step_).
  absl::Status StartPush();
  // The pull ended: the model restarts from it, or the elastic difference goes out.
  absl::Status Pulled();
  absl::Status Failed(const char* call, absl::Status status);

  ShardedClient* const client_;
  LocalModel* const model_;
  const ConsistencySpec spec_;
  const Hooks hooks_;
  std::vector<float> centre_;  // easgd: the centre pulled
  std::vector<float> out_;     // what a push sends: the change (local), the difference (easgd)
  bool started_ = false;       // the model was pulled from the centre once
  bool elastic_ = false;       // the pull in flight is easgd's, into centre_
  int64_t step_ = 0;           // the sequence of the push to come
  absl::Time call_start_;
  Exchanged exchanged_;
  const char* failed_call_ = "pull";
  // Calls in flight, declared after the buffers they use (destroyed first, waiting for them).
  ShardedClient::Pending<ShardedClient::Versions> pull_;
  ShardedClient::Pending<ShardedClient::PushSummary> push_;
};

}  // namespace ps
