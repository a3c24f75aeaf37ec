#include "common/partition.h"

#include <gtest/gtest.h>

namespace ps {
namespace {

TEST(PartRangeTest, CoversEverythingContiguouslyWithBalancedSizes) {
  for (int64_t n : {0, 1, 7, 10, 235146, 1000003}) {
    for (int parts : {1, 2, 3, 7, 16}) {
      int64_t expected_begin = 0, smallest = n, largest = 0;
      for (int i = 0; i < parts; ++i) {
        Range r = PartRange(n, i, parts);
        EXPECT_EQ(r.begin, expected_begin) << n << " " << parts << " " << i;
        expected_begin = r.end;
        smallest = std::min(smallest, r.size());
        largest = std::max(largest, r.size());
      }
      EXPECT_EQ(expected_begin, n);
      EXPECT_LE(largest - smallest, 1) << "n=" << n << " parts=" << parts;
    }
  }
}

TEST(PartRangeTest, UnevenSplitMatchesFormula) {
  // 10 over 3: [0,3) [3,6) [6,10)
  EXPECT_EQ(PartRange(10, 0, 3), (Range{0, 3}));
  EXPECT_EQ(PartRange(10, 1, 3), (Range{3, 6}));
  EXPECT_EQ(PartRange(10, 2, 3), (Range{6, 10}));
}

TEST(PartRangeTest, MoreShardsThanElementsGivesEmptyParts) {
  int empty = 0;
  for (int i = 0; i < 5; ++i) {
    Range r = PartRange(3, i, 5);
    EXPECT_LE(r.size(), 1);
    empty += r.size() == 0;
  }
  EXPECT_EQ(empty, 2);
}

TEST(PartRangeTest, HugeVectorsDoNotOverflow) {
  int64_t n = int64_t{1} << 62;
  EXPECT_EQ(PartRange(n, 3, 4).end, n);
  EXPECT_EQ(PartRange(n, 1, 4).begin, n / 4);
}

}  // namespace
}  // namespace ps
