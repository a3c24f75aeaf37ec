#include "server/state/norm_guard.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace ps {

absl::Status NormGuard::Check(double norm) const {
  if (ratio_ <= 0 || static_cast<int>(norms_.size()) < kMinimum) return absl::OkStatus();
  std::vector<double> sorted = norms_;
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  const double median = sorted[sorted.size() / 2];
  if (median <= 0 || norm <= ratio_ * median) return absl::OkStatus();  // nothing to judge by
  return absl::InvalidArgumentError(absl::StrFormat(
      "push dropped: its L2 norm %g is %.3g times the median (%g) of the last %d pushes applied, "
      "above --max_norm_ratio=%g (0 turns this guard off)",
      norm, norm / median, median, norms_.size(), ratio_));
}

void NormGuard::Accept(double norm) {
  if (ratio_ <= 0) return;
  if (static_cast<int>(norms_.size()) < kWindow) {
    norms_.push_back(norm);
  } else {
    norms_[accepted_ % kWindow] = norm;
  }
  ++accepted_;
}

}  // namespace ps
