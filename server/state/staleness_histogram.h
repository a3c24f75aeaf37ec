// Counts of staleness values (shard version at apply minus the version a gradient was computed
// from), exact up to kMaxExact with one overflow bucket above. Not thread-safe.
#pragma once

#include <cstdint>
#include <vector>

namespace ps {

class StalenessHistogram {
 public:
  static constexpr int64_t kMaxExact = 1023;

  void Add(int64_t staleness);
  // counts()[k] for k <= kMaxExact; the last entry counts values above kMaxExact. Trailing zero
  // buckets are omitted.
  const std::vector<int64_t>& counts() const { return counts_; }
  int64_t total() const { return total_; }

 private:
  std::vector<int64_t> counts_;
  int64_t total_ = 0;
};

}  // namespace ps
