// The logger's limiter (common/log.h): one line per interval, the others counted.
#include "common/log.h"

#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ps {
namespace {

TEST(LogLimiterTest, LetsOneLineThroughPerIntervalAndCountsTheOthers) {
  LogLimiter hourly(absl::Hours(1));
  int64_t held_back = -1;
  ASSERT_TRUE(hourly.Allow(&held_back));
  EXPECT_EQ(held_back, 0);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(hourly.Allow(&held_back));

  // However slowly the calls come, the next line says how many were held back since the last.
  LogLimiter limiter(absl::Milliseconds(100));
  ASSERT_TRUE(limiter.Allow(&held_back));
  int refused = 0;
  for (int i = 0; i < 5; ++i) refused += limiter.Allow(&held_back) ? 0 : 1;
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(limiter.Allow(&held_back));
  EXPECT_EQ(held_back, refused);
}

}  // namespace
}  // namespace ps
