#include "trainer/batch_sampler.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace ps {

BatchSampler::BatchSampler(int64_t count, int batch_size, uint64_t seed)
    : count_(count), batch_size_(batch_size), seed_(seed) {}

const std::vector<int32_t>& BatchSampler::Permutation(int64_t epoch) {
  if (epoch != cached_epoch_) {
    permutation_.resize(count_);
    std::iota(permutation_.begin(), permutation_.end(), 0);
    std::seed_seq seq{seed_, static_cast<uint64_t>(epoch)};
    std::mt19937_64 rng(seq);
    std::shuffle(permutation_.begin(), permutation_.end(), rng);
    cached_epoch_ = epoch;
  }
  return permutation_;
}

void BatchSampler::Indices(int64_t step, std::vector<int32_t>* indices) {
  indices->resize(batch_size_);
  for (int j = 0; j < batch_size_; ++j) {
    int64_t position = step * batch_size_ + j;
    (*indices)[j] = Permutation(position / count_)[position % count_];
  }
}

double BatchSampler::Epoch(int64_t step) const {
  return static_cast<double>(step) * batch_size_ / count_;
}

}  // namespace ps
