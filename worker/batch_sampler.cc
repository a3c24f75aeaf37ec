#include "worker/batch_sampler.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

namespace ps {

BatchSampler::BatchSampler(const Examples* examples, int batch_size, uint64_t seed)
    : examples_(examples), batch_size_(batch_size), seed_(seed) {}

const std::vector<int64_t>& BatchSampler::Permutation(int64_t epoch) {
  if (epoch != cached_epoch_) {
    permutation_.resize(examples_->count);
    std::iota(permutation_.begin(), permutation_.end(), 0);
    std::seed_seq seq{seed_, static_cast<uint64_t>(epoch)};
    std::mt19937_64 rng(seq);
    std::shuffle(permutation_.begin(), permutation_.end(), rng);
    cached_epoch_ = epoch;
  }
  return permutation_;
}

void BatchSampler::Batch(int64_t step, std::vector<float>* inputs, std::vector<int32_t>* labels) {
  int features = examples_->num_features;
  inputs->resize(static_cast<size_t>(batch_size_) * features);
  labels->resize(batch_size_);
  for (int j = 0; j < batch_size_; ++j) {
    int64_t position = step * batch_size_ + j;
    int64_t example = Permutation(position / examples_->count)[position % examples_->count];
    std::memcpy(inputs->data() + static_cast<size_t>(j) * features,
                examples_->features.data() + example * features, features * sizeof(float));
    (*labels)[j] = examples_->labels[example];
  }
}

double BatchSampler::Epoch(int64_t step) const {
  return static_cast<double>(step) * batch_size_ / examples_->count;
}

}  // namespace ps
