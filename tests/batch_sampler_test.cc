#include "trainer/batch_sampler.h"

#include <gtest/gtest.h>

#include <vector>

namespace ps {
namespace {

TEST(BatchSamplerTest, DeterministicAndEachEpochVisitsEveryExampleOnce) {
  BatchSampler a(10, 5, 42), b(10, 5, 42);
  std::vector<int32_t> ia, ib;
  std::vector<int> seen(10);
  for (int step : {0, 1}) {
    a.Indices(step, &ia);
    for (int32_t i : ia) ++seen[i];
  }
  EXPECT_EQ(seen, std::vector<int>(10, 1));
  a.Indices(7, &ia);  // a restarted worker jumping straight to step 7
  for (int step = 0; step <= 7; ++step) b.Indices(step, &ib);
  EXPECT_EQ(ia, ib);
  EXPECT_DOUBLE_EQ(a.Epoch(4), 2.0);
}

}  // namespace
}  // namespace ps
