// One training step whose communication overlaps its computation, as BytePS and PyTorch DDP
// overlap theirs, written once for the C++ worker (trainer/overlapped_step.h, over Network's
// layer hooks) and, through the C API (capi/paramserver_c.h), for Python's DistributedModel (over
// PyTorch's hooks): the forward pass starts each layer as soon as that layer's weights are in
// (Pending::WaitValues: first layer first, while the later ones are still arriving), and the
// backward pass sends each shard its part of the gradient as it becomes final (last layer first;
// over the data plane a piece at a time, Pending::Filled, else each part once its range is
// final), while the earlier layers' gradients are still being computed. The push keeps one
// sequence and one base (the versions the whole pull saw) over its parts, so a step's staleness is
// counted exactly as for a step that did not overlap.
//
// Use: construct it with the step's pull in flight; the forward pass calls WeightsNeeded for each
// layer's weights and WaitPull once it is over; backward calls GradientFinal for each range it
// made final (the first call starts the push); then TakePush and wait for it. Should the pull fail
// ABORTED (an attempt failed after the forward pass used values it brought), compute the step
// again on a new pull. Not thread-safe: one step, on one thread. Destroyed before TakePush, it
// waits for the pull and sends no part not sent yet (one going as backward made it is cut off:
// the shard applies nothing of it).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/sharded_client.h"

namespace ps {

class OverlapSchedule {
 public:
  struct Callbacks {
    // Runs once the whole pull arrived and was waited for, before any part of the push starts (a
    // worker starts the next step's prefetch there).
    std::function<void()> pulled;
    // Runs before the push's first part is sent (a delay injection); an error ends the step.
    std::function<absl::Status()> before_push;
  };

  // `pull` fills the weights the step computes on (in flight, or done); the push sends `gradient`
  // (total_params floats), which must stay valid until the push ended. REQUIRES: `client`
  // outlives this and its pushes start on this thread only (ShardedClient's rule).
  OverlapSchedule(ShardedClient* client, ShardedClient::Pending<ShardedClient::Versions> pull,
                  absl::Span<const float> gradient, Callbacks callbacks = {});

  // The forward pass needs the weights [begin, end): waits up to `timeout` for them (nullopt
  // while they are still coming), OK once they are in (at once after WaitPull), else the pull's
  // error (ABORTED: compute again on a new pull; INVALID_ARGUMENT for a range outside the model).
  std::optional<absl::Status> WeightsNeeded(int64_t begin, int64_t end, absl::Duration timeout);
  absl::Status WeightsNeeded(int64_t begin, int64_t end);
  // The forward pass is over: waits up to `timeout` for the whole pull (nullopt while it goes
  // on), whose versions become the push's base, and runs `pulled` once. OK once done, else the
  // pull's error.
  std::optional<absl::Status> WaitPull(absl::Duration timeout);
  absl::Status WaitPull();
  bool pulled() const { return pulled_; }

  // Backward made the gradient [begin, end) final (a layer's, a parameter's: in any order, and
  // ranges may overlap). The first call waits for the pull (its base), runs before_push and
  // starts the push with its parts held; then each shard's part goes once its range is all final,
  // and, where its shard takes a push's values as they come, the values from the start of the
  // final part that reaches the model's end go as they become final (Pending::Filled). Errors:
  // the pull's, or before_push's.
  absl::Status GradientFinal(int64_t begin, int64_t end);
  // Whether any of the gradient [begin, end) was made final in this step (a second backward
  // would write into what is being pushed).
  bool Final(int64_t begin, int64_t end) const;
  // Where the final values that reach the model's end start, as the push was told (Filled);
  // total_params while none do.
  int64_t filled_from() const { return filled_from_; }

  // "pull" or "push": which call made the step fail (meaningful once a call above failed).
  const char* failed_call() const { return failed_call_; }
  // Time the forward pass spent waiting for weights.
  absl::Duration pull_wait() const { return pull_wait_; }
  // The versions the step's pull saw. REQUIRES: pulled().
  const ShardedClient::Versions& versions() const { return versions_; }

  // The step's push with every part sent (those backward did not make final, now): wait for it.
  // REQUIRES: the backward pass ended (the gradient is final), without error, and made some of
  // the gradient final (GradientFinal).
  ShardedClient::Pending<ShardedClient::PushSummary> TakePush();

 private:
  // Records [begin, end) as final; returns where the final values reaching the model's end start.
  int64_t MarkFinal(int64_t begin, int64_t end);
  // Sends each shard's part whose range is all final.
  void SendFinalParts();

  ShardedClient* const client_;
  ShardedClient::Pending<ShardedClient::Versions> pull_;
  const absl::Span<const float> gradient_;
  const Callbacks callbacks_;
  bool pulled_ = false;  // the whole pull was waited for
  ShardedClient::Versions versions_;
  std::map<int64_t, int64_t> final_;  // the gradient's final ranges, begin -> end, merged
  std::vector<bool> sent_;            // by shard: its part was sent whole
  int64_t filled_from_;               // what the push was told is final at its end
  ShardedClient::Pending<ShardedClient::PushSummary> push_;
  const char* failed_call_ = "pull";
  absl::Duration pull_wait_;
};

}  // namespace ps
