// A guard against absurd pushes: a gradient (or an EASGD difference) whose L2 norm is more than
// `ratio` times the median norm of the last kWindow pushes the shard applied is to be dropped.
// Finite but huge values (3e38 in every element) pass the non-finite checks and would wreck the
// weights for good; one honest push is never that far from the others. Judged only once kMinimum
// norms were seen, so the first pushes of a job always pass. Not thread-safe: the shard calls it
// under its lock. Not replicated: a backup applies what its primary accepted.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace ps {

class NormGuard {
 public:
  static constexpr int kWindow = 64;
  static constexpr int kMinimum = 16;

  // `ratio` 0: off (Check always passes).
  explicit NormGuard(double ratio) : ratio_(ratio) {}

  // OK, or INVALID_ARGUMENT saying how far `norm` is above the median (and the flag that sets the
  // bound), for the log. Changes nothing.
  absl::Status Check(double norm) const;
  // Records the norm of a push that was applied.
  void Accept(double norm);

 private:
  const double ratio_;
  std::vector<double> norms_;  // the last kWindow accepted, a ring
  int64_t accepted_ = 0;
};

}  // namespace ps
