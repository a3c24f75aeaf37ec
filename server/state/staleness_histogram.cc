#include "server/state/staleness_histogram.h"

#include <algorithm>

namespace ps {

void StalenessHistogram::Add(int64_t staleness) {
  size_t bucket = static_cast<size_t>(std::clamp<int64_t>(staleness, 0, kMaxExact + 1));
  if (counts_.size() <= bucket) counts_.resize(bucket + 1, 0);
  ++counts_[bucket];
  ++total_;
}

}  // namespace ps
