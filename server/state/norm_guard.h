// A guard against absurd pushes: a gradient (or an EASGD difference) whose L2 norm is more than
// `ratio` times the job's reference norm is to be dropped. Finite but huge values (3e38 in every
// element) pass the non-finite checks and would wreck the weights for good; one honest push is
// never that far from the others.
//
// The reference is one vote per worker: each worker's median over its own last kWindow pushes
// applied, and of those medians the middle one (the lower of the two middle ones for an even
// count). So no worker, and no token that acts as one worker, can walk the reference upward with
// pushes of its own kept under the bound: with two other workers pushing, its vote is outside the
// middle whatever it pushes; alone, it is the job. Judged only once kMinimum pushes were applied,
// so the first pushes of a job always pass. Not thread-safe: the shard calls it under its lock.
// Not replicated: a backup applies what its primary accepted.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"

namespace ps {

class NormGuard {
 public:
  static constexpr int kWindow = 16;
  static constexpr int kMinimum = 16;

  // `ratio` 0: off (Check always passes).
  explicit NormGuard(double ratio) : ratio_(ratio) {}

  // OK, or INVALID_ARGUMENT saying how far worker `worker`'s push of `norm` is above the
  // reference (and the flag that sets the bound), for the log. Changes nothing.
  absl::Status Check(int worker, double norm) const;
  // Records the norm of a push by `worker` that was applied.
  void Accept(int worker, double norm);
  // The reference pushes are judged by (0 before kMinimum were applied, or when off).
  double reference() const { return accepted_ >= kMinimum ? reference_ : 0; }

 private:
  struct Recent {
    std::vector<double> norms;  // the last kWindow accepted, a ring
    int64_t accepted = 0;
    double median = 0;
  };

  const double ratio_;
  std::map<int, Recent> workers_;
  int64_t accepted_ = 0;
  double reference_ = 0;  // the middle of the workers' medians
};

}  // namespace ps
