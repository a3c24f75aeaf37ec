// Server-side optimizers: one small class per algorithm, each owning its per-element state for the
// shard's range. Not thread-safe; ParameterShard serialises calls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ps {

// Hyper-parameters other than the learning rate, which comes from a LearningRateSchedule.
struct OptimizerConfig {
  std::string name = "sgd";  // sgd | momentum | nesterov | adam | adagrad
  float momentum = 0.9f;     // momentum, nesterov
  float beta1 = 0.9f;        // adam
  float beta2 = 0.999f;      // adam
  float epsilon = 1e-8f;     // adam, adagrad
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string Name() const = 0;

  // Updates weights[i] with grad[i]; the elements sit at `state_offset` within the shard's range
  // (where their optimizer state lives). `step` counts updates applied before this one.
  // All or nothing: if the update would make any weight or state value non-finite (a finite but
  // huge gradient can), fails with INVALID_ARGUMENT naming the first such element and changes
  // nothing. REQUIRES: weights.size() == grad.size(), state_offset + size <= the size given at
  // creation.
  absl::Status Apply(absl::Span<float> weights, absl::Span<const float> grad, int64_t state_offset,
                     float learning_rate, int64_t step);

  // The per-element state by slot name ("momentum", "adam_m", ...), as views of the optimizer's
  // own buffers (one value per element of the shard): checkpoints read them and restore into them.
  virtual std::vector<std::pair<std::string, absl::Span<float>>> State() = 0;

 protected:
  // The update with kCommit = false computes without writing and returns the index of the first
  // element whose new weight or state would be non-finite (-1: none); with kCommit = true it
  // writes. Both passes run the same arithmetic, so the check is exact.
  virtual int64_t FirstNonFinite(absl::Span<const float> w, absl::Span<const float> g,
                                 int64_t offset, float lr, int64_t step) = 0;
  virtual void Commit(absl::Span<float> w, absl::Span<const float> g, int64_t offset, float lr,
                      int64_t step) = 0;
};

// Creates the optimizer named in `config` for `size` elements, or fails naming the unknown
// optimizer or the bad hyper-parameter.
absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& config,
                                                         int64_t size);

}  // namespace ps
