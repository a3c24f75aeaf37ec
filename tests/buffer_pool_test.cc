#include "server/state/buffer_pool.h"

#include <gtest/gtest.h>

#include <thread>

namespace ps {
namespace {

TEST(BufferPoolTest, ReusesTheSmallestIdleBufferThatFits) {
  BufferPool pool;
  const float* big;
  const float* small;
  {
    BufferPool::Lease a = pool.Acquire(1000), b = pool.Acquire(10);
    big = a.span().data();
    small = b.span().data();
    EXPECT_EQ(a.span().size(), 1000u);
  }
  EXPECT_EQ(pool.Acquire(5).span().data(), small);
  BufferPool::Lease c = pool.Acquire(500);
  EXPECT_EQ(c.span().data(), big);
  EXPECT_EQ(c.span().size(), 500u);
  EXPECT_NE(pool.Acquire(2000).span().data(), big);  // nothing idle is large enough
}

TEST(BufferPoolTest, KeepsTheLargestBuffersWhenFull) {
  BufferPool pool(1);
  const float* large;
  {
    BufferPool::Lease a = pool.Acquire(100), b = pool.Acquire(10);
    large = a.span().data();
  }
  EXPECT_EQ(pool.Acquire(50).span().data(), large);
}

TEST(BufferPoolTest, ConcurrentLeasesNeverShareABuffer) {
  BufferPool pool(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, t] {
      for (int i = 0; i < 2000; ++i) {
        BufferPool::Lease l = pool.Acquire(64 + (i % 7));
        for (float& v : l.span()) v = static_cast<float>(t);
        for (float v : l.span()) ASSERT_EQ(v, static_cast<float>(t));
      }
    });
  }
  for (std::thread& th : threads) th.join();
}

}  // namespace
}  // namespace ps

namespace ps {
namespace {

TEST(BufferPoolTest, TrimFreesOnlyBuffersUnusedForTheGivenTime) {
  BufferPool pool;
  { BufferPool::Lease a = pool.Acquire(1000), b = pool.Acquire(10); }
  EXPECT_EQ(pool.IdleBytes(), 1010 * sizeof(float));
  pool.Trim(absl::Seconds(10));  // both were used just now
  EXPECT_EQ(pool.IdleBytes(), 1010 * sizeof(float));
  pool.Trim(absl::Seconds(10), absl::Now() + absl::Seconds(11));
  EXPECT_EQ(pool.IdleBytes(), 0u);
  const float* fresh = pool.Acquire(10).span().data();  // works as before, from a new buffer
  EXPECT_EQ(pool.Acquire(10).span().data(), fresh);
}

}  // namespace
}  // namespace ps
