// Deterministic minibatches over a worker's `count` examples: epoch e visits them in a permutation
// seeded by (seed, e), and step s takes positions [s*B, (s+1)*B) of that endless sequence. Because
// the batch depends only on the step, a restarted worker resumes exactly where it stopped.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <vector>

namespace ps {

class BatchSampler {
 public:
  // REQUIRES: batch_size > 0; 0 < count < 2^31.
  BatchSampler(int64_t count, int batch_size, uint64_t seed);

  // The batch_size example indices of `step`.
  void Indices(int64_t step, std::vector<int32_t>* indices);

  // The epoch (pass over the examples) that `step` falls in, counting from 0.
  double Epoch(int64_t step) const;

 private:
  const std::vector<int32_t>& Permutation(int64_t epoch);

  int64_t count_;
  int batch_size_;
  uint64_t seed_;
  int64_t cached_epoch_ = -1;
  std::vector<int32_t> permutation_;
};

}  // namespace ps
