#include "common/partition.h"

#include <algorithm>

namespace ps {

Range PartRange(int64_t n, int index, int parts) {
  // 128-bit intermediate: index * n overflows int64 for n near 2^63 / parts.
  auto bound = [&](int64_t i) {
    return static_cast<int64_t>(static_cast<__int128>(i) * n / parts);
  };
  return Range{bound(index), bound(index + 1)};
}

std::vector<PartSlice> SplitAcrossParts(int64_t n, int parts, int64_t lo, int64_t hi) {
  std::vector<PartSlice> out;
  for (int p = 0; p < parts; ++p) {
    Range r = PartRange(n, p, parts);
    int64_t b = std::max(lo, r.begin), e = std::min(hi, r.end);
    if (b < e) out.push_back({p, Range{b, e}});
  }
  return out;
}

}  // namespace ps
