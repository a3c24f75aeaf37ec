// Timing for benchmarks: the median of several runs of a piece of work.
#pragma once

#include <algorithm>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ps {

// Runs fn() `repeats` (>= 1) times and returns the median wall time in seconds.
template <typename Fn>
double MedianSeconds(int repeats, Fn fn) {
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    absl::Time start = absl::Now();
    fn();
    t.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace ps
