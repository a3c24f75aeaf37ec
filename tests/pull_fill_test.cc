// How far a pull's values are in place as its parts' runs arrive (client/pull_fill.h).
#include "client/pull_fill.h"

#include <gtest/gtest.h>

#include <thread>

#include "absl/time/clock.h"

namespace ps {
namespace {

using Found = PullFill::Found;

TEST(PullFillTest, APartsValuesCountFromItsStartWhateverOrderItsStripesComeIn) {
  PullFill fill({{0, 100}, {100, 300}});
  ASSERT_TRUE(fill.Attempt(1));
  // Shard 1's part in two stripes of 100: the second stripe's runs first.
  fill.InPlace(1, 100, 40);
  fill.InPlace(1, 140, 60);
  EXPECT_EQ(fill.WaitFor(1, 1, absl::ZeroDuration()), Found::kTimedOut);
  fill.InPlace(1, 0, 50);
  EXPECT_EQ(fill.WaitFor(1, 51, absl::ZeroDuration()), Found::kTimedOut);
  EXPECT_EQ(fill.WaitFor(1, 50, absl::ZeroDuration()), Found::kInPlace);
  fill.InPlace(1, 50, 50);  // closes the gap: all 200
  EXPECT_EQ(fill.WaitFor(1, 200, absl::ZeroDuration()), Found::kInPlace);
  // Shard 0's part is apart.
  EXPECT_EQ(fill.WaitFor(0, 1, absl::ZeroDuration()), Found::kTimedOut);
}

TEST(PullFillTest, AWaitEndsWhenTheValuesComeOrThePartEnds) {
  PullFill fill({{0, 10}});
  ASSERT_TRUE(fill.Attempt(0));
  std::thread coming([&] {
    absl::SleepFor(absl::Milliseconds(50));
    fill.InPlace(0, 0, 5);
  });
  EXPECT_EQ(fill.WaitFor(0, 5, absl::Minutes(1)), Found::kInPlace);
  coming.join();
  std::thread ending([&] {
    absl::SleepFor(absl::Milliseconds(50));
    fill.Ended(0);
  });
  EXPECT_EQ(fill.WaitFor(0, 10, absl::Minutes(1)), Found::kEnded);
  ending.join();
}

TEST(PullFillTest, ValuesUsedAreNeverRewrittenAndUnusedOnesCountNoMoreOnceTheirAttemptFailed) {
  PullFill fill({{0, 10}, {10, 20}});
  // Shard 0: values in place, then its attempt failed before anyone used them.
  ASSERT_TRUE(fill.Attempt(0));
  fill.InPlace(0, 0, 5);
  fill.Failed(0);
  EXPECT_EQ(fill.WaitFor(0, 5, absl::ZeroDuration()), Found::kTimedOut);
  EXPECT_TRUE(fill.Attempt(0));  // the retry may rewrite them
  // Shard 1: values used, then its attempt failed: no other attempt may start.
  ASSERT_TRUE(fill.Attempt(1));
  fill.InPlace(1, 0, 5);
  EXPECT_EQ(fill.WaitFor(1, 3, absl::ZeroDuration()), Found::kInPlace);
  fill.Failed(1);
  EXPECT_EQ(fill.WaitFor(1, 5, absl::ZeroDuration()), Found::kInPlace);  // still there
  EXPECT_FALSE(fill.Attempt(1));
  EXPECT_TRUE(fill.Attempt(0));
}

}  // namespace
}  // namespace ps
