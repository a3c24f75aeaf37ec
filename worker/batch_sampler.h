// Deterministic minibatches over a worker's examples: epoch e visits them in a permutation seeded
// by (seed, e), and step s takes examples [s*B, (s+1)*B) of that endless sequence. Because the
// batch depends only on the step, a restarted worker resumes exactly where it stopped.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/idx_dataset.h"

namespace ps {

class BatchSampler {
 public:
  // REQUIRES: examples outlives this; batch_size > 0; examples->count > 0.
  BatchSampler(const Examples* examples, int batch_size, uint64_t seed);

  // Fills inputs [batch_size, num_features] and labels [batch_size] for `step`.
  void Batch(int64_t step, std::vector<float>* inputs, std::vector<int32_t>* labels);

  // The epoch (pass over the examples) that `step` falls in, counting from 0.
  double Epoch(int64_t step) const;

 private:
  const std::vector<int64_t>& Permutation(int64_t epoch);

  const Examples* examples_;
  int batch_size_;
  uint64_t seed_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> permutation_;
};

}  // namespace ps
