// The C++ worker's step whose communication overlaps its computation: the overlap schedule
// (client/overlap_schedule.h) driven by Network's layer hooks, whose layers come in the flat
// vector's order (the forward pass needs [0, end), backward makes [begin, total) final).
//
// Use: construct it with the step's pull in flight, pass Hooks() to
// Network::GradientOfExamples, then TakePush() and wait for it; the rest is OverlapSchedule's
// (failed_call, pull_wait, versions, and what a failed pull means). Not thread-safe.
#pragma once

#include <cstdint>

#include "client/overlap_schedule.h"
#include "trainer/network.h"

namespace ps {

class OverlappedStep : public OverlapSchedule {
 public:
  // As OverlapSchedule's.
  OverlappedStep(ShardedClient* client, ShardedClient::Pending<ShardedClient::Versions> pull,
                 absl::Span<const float> gradient, Callbacks callbacks = {});

  // The Network's hooks for this step. A hook's error is the pull's or the push's (failed_call()
  // says which), or before_push's.
  Network::LayerHooks Hooks();

 private:
  const int64_t total_;  // the model's values
};

}  // namespace ps
