#include "common/partition.h"

namespace ps {

Range PartRange(int64_t n, int index, int parts) {
  // 128-bit intermediate: index * n overflows int64 for n near 2^63 / parts.
  auto bound = [&](int64_t i) {
    return static_cast<int64_t>(static_cast<__int128>(i) * n / parts);
  };
  return Range{bound(index), bound(index + 1)};
}

}  // namespace ps
