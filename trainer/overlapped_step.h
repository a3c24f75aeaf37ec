// One training step whose communication overlaps its computation, as BytePS and PyTorch DDP
// overlap theirs: the forward pass starts each layer as soon as that layer's weights are in
// (Pending::WaitValues: first layer first, while the later ones are still arriving), and the
// backward pass sends each shard its part of the gradient as it becomes
// final (last layer first; over the data plane a piece at a time, Pending::Filled, else each part
// once its range is final), while the earlier layers' gradients are still being computed. The push
// keeps one sequence and one base (the versions the whole pull saw) over its parts, so a step's
// staleness is counted exactly as for a step that did not overlap.
//
// Use: construct it with the step's pull in flight, pass Hooks() to
// Network::GradientOfExamples, then TakePush() and wait for it. Should the pull fail ABORTED (an
// attempt failed after the forward pass used values it brought), compute the step again on a new
// pull. Not thread-safe: one step, on one thread. Destroyed before TakePush, it waits for the pull
// and sends no part not sent yet (one going as backward made it is cut off: the shard applies
// nothing of it).
#pragma once

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "trainer/network.h"
#include "client/sharded_client.h"

namespace ps {

class OverlappedStep {
 public:
  struct Callbacks {
    // Runs once the whole pull arrived and was waited for, before any part of the push starts (a
    // worker starts the next step's prefetch there).
    std::function<void()> pulled;
    // Runs before the push's first part is sent (a delay injection); an error ends the step.
    std::function<absl::Status()> before_push;
  };

  // `pull` fills the weights the step computes on (in flight, or done); the push sends `gradient`,
  // which must stay valid until the push ended. REQUIRES: `client` outlives this and its pushes
  // start on this thread only (ShardedClient's rule).
  OverlappedStep(ShardedClient* client, ShardedClient::Pending<ShardedClient::Versions> pull,
                 absl::Span<const float> gradient, Callbacks callbacks = {});

  // The Network's hooks for this step. A hook's error is the pull's or the push's (failed_call()
  // says which), or before_push's.
  Network::LayerHooks Hooks();

  // "pull" or "push": which call made the step fail (meaningful once a hook failed).
  const char* failed_call() const { return failed_call_; }
  // Time the forward pass spent waiting for weights.
  absl::Duration pull_wait() const { return pull_wait_; }
  // The versions the step's pull saw. REQUIRES: the forward pass reached its last layer.
  const ShardedClient::Versions& versions() const { return versions_; }

  // The step's push with every part sent (those the backward pass did not reach, now): wait for
  // it. REQUIRES: the backward pass ended (the gradient is final), without error.
  ShardedClient::Pending<ShardedClient::PushSummary> TakePush();

 private:
  absl::Status WeightsNeeded(int64_t end);
  absl::Status GradientFinal(int64_t begin);

  ShardedClient* const client_;
  ShardedClient::Pending<ShardedClient::Versions> pull_;
  const absl::Span<const float> gradient_;
  const Callbacks callbacks_;
  bool pulled_ = false;  // the whole pull was waited for
  ShardedClient::Versions versions_;
  ShardedClient::Pending<ShardedClient::PushSummary> push_;
  const char* failed_call_ = "pull";
  absl::Duration pull_wait_;
};

}  // namespace ps
