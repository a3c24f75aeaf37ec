// The one place that knows the flat-layout arithmetic: how N elements split into S contiguous,
// balanced ranges (shards of parameters, or data shards of examples).
#pragma once

#include <cstdint>

namespace ps {

// A half-open range [begin, end) of the flat vector.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool Contains(int64_t lo, int64_t hi) const { return begin <= lo && lo <= hi && hi <= end; }
  bool operator==(const Range& o) const { return begin == o.begin && end == o.end; }
};

// Range of part `index` when `n` elements are split into `parts` balanced contiguous parts:
// [index*n/parts, (index+1)*n/parts). Sizes differ by at most one; with parts > n some are empty.
// REQUIRES: n >= 0, parts > 0, 0 <= index < parts.
Range PartRange(int64_t n, int index, int parts);

}  // namespace ps
