#include "trainer/delay.h"

#include <gtest/gtest.h>

namespace ps {
namespace {

TEST(DelayTest, ParsesAndDrawsSeededDelays) {
  EXPECT_FALSE(Delay::Parse("", 1)->enabled());
  EXPECT_EQ(Delay::Parse("fixed:0.25", 1)->Next(), absl::Milliseconds(250));
  Delay a = *Delay::Parse("uniform:0.1,0.2", 7), b = *Delay::Parse("uniform:0.1,0.2", 7);
  for (int i = 0; i < 100; ++i) {
    absl::Duration d = a.Next();
    EXPECT_EQ(d, b.Next());
    EXPECT_GE(d, absl::Milliseconds(100));
    EXPECT_LE(d, absl::Milliseconds(200));
  }
  Delay e = *Delay::Parse("exp:0.01", 3);
  absl::Duration total;
  for (int i = 0; i < 4000; ++i) total += e.Next();
  EXPECT_NEAR(absl::ToDoubleSeconds(total) / 4000, 0.01, 0.001);
  for (const char* bad : {"fixed", "fixed:-1", "uniform:2,1", "gauss:1", "exp:x"}) {
    EXPECT_FALSE(Delay::Parse(bad, 1).ok()) << bad;
  }
}

}  // namespace
}  // namespace ps
