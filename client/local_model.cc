#include "client/local_model.h"

#include <algorithm>

namespace ps {

LocalModel::LocalModel(absl::Span<float> params, float momentum)
    : x_(params), momentum_(momentum), start_(params.size()) {}

void LocalModel::Restart() { std::copy(x_.begin(), x_.end(), start_.begin()); }

void LocalModel::Step(absl::Span<const float> gradient, float lr) {
  if (velocity_.empty()) velocity_.assign(x_.size(), 0.0f);
  for (size_t i = 0; i < x_.size(); ++i) {
    velocity_[i] = momentum_ * velocity_[i] + gradient[i];
    x_[i] -= lr * velocity_[i];
  }
}

void LocalModel::Elastic(absl::Span<const float> centre, float alpha, absl::Span<float> diff) {
  for (size_t i = 0; i < x_.size(); ++i) {
    diff[i] = alpha * (x_[i] - centre[i]);
    x_[i] -= diff[i];
  }
}

void LocalModel::Change(absl::Span<float> change) const {
  for (size_t i = 0; i < x_.size(); ++i) change[i] = x_[i] - start_[i];
}

}  // namespace ps
