// A worker's own model under easgd and local SGD (common/consistency_spec.h): trained on the
// worker's data between exchanges with the shards, which hold the centre (the model the job
// trains), with SGD and momentum (Step: the C++ worker's) or an optimizer of the caller's own (a
// PyTorch one); the exchange's arithmetic is here (Restart, Elastic, Change: LocalExchange,
// client/local_exchange.h, calls them). Only a cache: a worker killed and restarted starts over
// from the centre (Restart) and loses nothing the job needs.
// The model's values live in a buffer the worker owns (the one it computes gradients from); this
// class keeps the momentum (from the first Step on) and the values of the last restart. Not
// thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace ps {

class LocalModel {
 public:
  // `params`: the worker's model values (valid as long as this); `momentum` in [0, 1).
  LocalModel(absl::Span<float> params, float momentum);

  // The model's values (the buffer given at construction).
  absl::Span<float> values() const { return x_; }

  // The values in params were just pulled from the shards: the model starts over from them, and
  // Change() is measured from here. Keeps the momentum.
  void Restart();
  // One SGD step with momentum: v = momentum * v + gradient; x -= lr * v.
  void Step(absl::Span<const float> gradient, float lr);
  // The worker's side of an elastic exchange with `centre` (EASGD): diff = alpha * (x - centre),
  // x -= diff. Writes diff, which the shard adds to the centre, to `diff`.
  void Elastic(absl::Span<const float> centre, float alpha, absl::Span<float> diff);
  // The change of the model since the last Restart: x - x_restart (local SGD pushes it).
  void Change(absl::Span<float> change) const;

 private:
  absl::Span<float> x_;
  float momentum_;
  std::vector<float> velocity_;
  std::vector<float> start_;
};

}  // namespace ps
