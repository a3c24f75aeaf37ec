#include "server/state/norm_guard.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace ps {
namespace {
// The lower middle of `values` (not empty); reorders them.
double LowerMedian(std::vector<double>& values) {
  auto middle = values.begin() + (values.size() - 1) / 2;
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}
}  // namespace

absl::Status NormGuard::Check(int worker, double norm) const {
  const double reference = this->reference();
  if (ratio_ <= 0 || reference <= 0 || norm <= ratio_ * reference) {
    return absl::OkStatus();  // off, nothing to judge by yet, or within the bound
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "push dropped: its L2 norm %g is %.3g times the reference (%g: the middle of %d workers' "
      "median norms over their last %d pushes applied), above --max_norm_ratio=%g (0 turns this "
      "guard off)",
      norm, norm / reference, reference, workers_.size(), kWindow, ratio_));
}

void NormGuard::Accept(int worker, double norm) {
  if (ratio_ <= 0) return;
  Recent& recent = workers_[worker];
  if (static_cast<int>(recent.norms.size()) < kWindow) {
    recent.norms.push_back(norm);
  } else {
    recent.norms[recent.accepted % kWindow] = norm;
  }
  ++recent.accepted;
  std::vector<double> values = recent.norms;
  recent.median = LowerMedian(values);
  values.clear();
  for (const auto& [id, w] : workers_) values.push_back(w.median);
  reference_ = LowerMedian(values);
  ++accepted_;
}

}  // namespace ps
