#include "server/state/optimizer.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

namespace ps {
namespace {

// Applies `steps` updates of gradient g to a single weight starting at 1.
std::vector<float> ApplySteps(const std::string& name, const std::vector<float>& grads,
                              float lr = 0.1f) {
  OptimizerConfig c;
  c.name = name;
  auto opt = MakeOptimizer(c, 1);
  EXPECT_TRUE(opt.ok()) << opt.status();
  std::vector<float> w = {1.0f}, trace;
  for (size_t t = 0; t < grads.size(); ++t) {
    EXPECT_TRUE((*opt)->Apply(absl::MakeSpan(w), absl::MakeConstSpan(&grads[t], 1), lr, t).ok());
    trace.push_back(w[0]);
  }
  return trace;
}

TEST(OptimizerTest, SgdMatchesHandComputedValues) {
  std::vector<float> w = ApplySteps("sgd", {0.5f, -1.0f});
  EXPECT_FLOAT_EQ(w[0], 0.95f);  // 1 - 0.1*0.5
  EXPECT_FLOAT_EQ(w[1], 1.05f);  // 0.95 + 0.1
}

TEST(OptimizerTest, MomentumMatchesHandComputedValues) {
  std::vector<float> w = ApplySteps("momentum", {0.5f, 0.5f});
  EXPECT_FLOAT_EQ(w[0], 0.95f);   // v=0.5
  EXPECT_FLOAT_EQ(w[1], 0.855f);  // v=0.9*0.5+0.5=0.95
}

// Momentum decaying towards zero passes through the denormal range, which costs ~100 cycles per
// operation on many Intel processors: the optimizer flushes denormals to zero (on every thread
// that applies), so a denormal velocity becomes 0 instead of 0.9 times itself.
TEST(OptimizerTest, DenormalStateIsFlushedToZero) {
  const int64_t n = 3 * ApplyThreads::kMinPart;  // several parts: the pool's threads flush too
  ApplyThreads threads(3);
  OptimizerConfig c;
  c.name = "momentum";
  auto opt = MakeOptimizer(c, n);
  ASSERT_TRUE(opt.ok());
  const float denormal = 1e-39f;
  ASSERT_GT(denormal, 0.0f);
  ASSERT_LT(denormal, std::numeric_limits<float>::min());
  for (auto& [slot, values] : (*opt)->MutableState())
    std::fill(values.begin(), values.end(), denormal);
  std::vector<float> w(n, 1.0f), g(n, 0.0f);
  ASSERT_TRUE((*opt)->Apply(absl::MakeSpan(w), g, 0.1f, 0, &threads).ok());
  for (auto& [slot, values] : (*opt)->State()) {
    EXPECT_EQ(std::count(values.begin(), values.end(), 0.0f), n) << slot;
  }
  // The calling thread's mode is restored afterwards.
  volatile float tiny = denormal;
  EXPECT_GT(tiny * 1.0f, 0.0f);
}

TEST(OptimizerTest, NesterovMatchesHandComputedValues) {
  std::vector<float> w = ApplySteps("nesterov", {0.5f, 0.5f});
  EXPECT_FLOAT_EQ(w[0], 0.905f);            // v=0.5; step g+0.9v=0.95
  EXPECT_FLOAT_EQ(w[1], 0.905f - 0.1355f);  // v=0.95; step 0.5+0.855=1.355
}

TEST(OptimizerTest, AdamMatchesHandComputedValues) {
  // Bias-corrected first step moves by lr * g/|g|; the second with the same g too.
  std::vector<float> w = ApplySteps("adam", {0.5f, 0.5f});
  EXPECT_NEAR(w[0], 0.9f, 1e-6);
  EXPECT_NEAR(w[1], 0.8f, 1e-6);
  // A gradient of the other sign after one step: m=0.05*0.9-0.1*0.5... computed in double:
  double m = 0.9 * 0.05 + 0.1 * -0.5, v = 0.999 * 0.00025 + 0.001 * 0.25;
  double step = 0.1 * (m / (1 - 0.81)) / (std::sqrt(v / (1 - 0.998001)) + 1e-8);
  EXPECT_NEAR(ApplySteps("adam", {0.5f, -0.5f})[1], 0.9 - step, 1e-6);
}

TEST(OptimizerTest, AdaGradMatchesHandComputedValues) {
  std::vector<float> w = ApplySteps("adagrad", {0.5f, 0.5f});
  EXPECT_NEAR(w[0], 0.9f, 1e-6);                            // s=0.25
  EXPECT_NEAR(w[1], 0.9f - 0.05f / std::sqrt(0.5f), 1e-6);  // s=0.5
}

// Every optimizer on several threads, with and without the bound that skips the check pass, writes
// exactly what one thread with the check writes; and an update that would overflow is refused
// whole, wherever the bad element lies.
TEST(OptimizerTest, ThreadsAndBoundsChangeNoValue) {
  const int64_t n = 5 * ApplyThreads::kMinPart + 37;  // several parts and a ragged end
  ApplyThreads threads(4);
  ASSERT_EQ(threads.Parts(n), 4);
  for (const char* name : {"sgd", "momentum", "nesterov", "adam", "adagrad"}) {
    SCOPED_TRACE(name);
    OptimizerConfig c;
    c.name = name;
    auto serial = MakeOptimizer(c, n);
    auto parallel = MakeOptimizer(c, n);
    ASSERT_TRUE(serial.ok() && parallel.ok());
    std::vector<float> w1(n), w2(n), g(n);
    for (int64_t i = 0; i < n; ++i) w1[i] = w2[i] = std::sin(0.001 * i);
    for (int step = 0; step < 4; ++step) {
      for (int64_t i = 0; i < n; ++i) g[i] = std::cos(0.37 * i + step);
      const GradientSummary scan = ScanGradient(g, &threads);
      EXPECT_EQ(scan.first_nonfinite, -1);
      EXPECT_FLOAT_EQ(scan.max_abs, 1.0f);
      ASSERT_TRUE((*serial)->Apply(absl::MakeSpan(w1), g, 0.01f, step).ok());
      ASSERT_TRUE(
          (*parallel)->Apply(absl::MakeSpan(w2), g, 0.01f, step, &threads, scan.max_abs).ok());
      ASSERT_EQ(w1, w2);
    }
    // A gradient that overflows one weight near the end (in the last part): nothing changes.
    std::vector<float> before = w2;
    g[n - 3] = 3e38f;
    for (float lr : {-1e30f, 1e30f}) {
      absl::Status s = (*parallel)->Apply(absl::MakeSpan(w2), g, lr, 5, &threads,
                                          ScanGradient(g, &threads).max_abs);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(w2, before);
    }
    // State written from outside (a restore) is not trusted for the bound afterwards: with the
    // magnitudes of the last update, a gradient of 5e37 would pass the bound for momentum, but
    // 0.9 * 3.4e38 + 5e37 overflows.
    for (auto& [slot, values] : (*parallel)->MutableState()) values[7] = 3.4e38f;
    if (!(*parallel)->State().empty()) {
      EXPECT_FALSE(
          (*parallel)
              ->Apply(absl::MakeSpan(w2), std::vector<float>(n, 5e37f), 1e-3f, 6, &threads, 5e37f)
              .ok());
      EXPECT_EQ(w2, before);
    }
  }
}

TEST(ApplyThreadsTest, RunCoversEveryElementOnceInWholeCacheLines) {
  ApplyThreads threads(3);
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{17}, ApplyThreads::kMinPart - 1,
                    2 * ApplyThreads::kMinPart + 5, 10 * ApplyThreads::kMinPart}) {
    SCOPED_TRACE(n);
    std::vector<int> seen(n, 0);
    std::vector<int> parts_seen(3, 0);
    threads.Run(n, [&](int part, int64_t begin, int64_t end) {
      ++parts_seen[part];
      EXPECT_EQ(begin % 16, 0);
      EXPECT_TRUE(end % 16 == 0 || end == n);
      for (int64_t i = begin; i < end; ++i) ++seen[i];
    });
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), n);
    for (int part = 0; part < 3; ++part) {
      EXPECT_EQ(parts_seen[part], n > 0 && part < threads.Parts(n) ? 1 : 0) << part;
    }
  }
  EXPECT_EQ(threads.Parts(ApplyThreads::kMinPart - 1), 1);  // small: the caller alone
  EXPECT_EQ(threads.Parts(100 * ApplyThreads::kMinPart), 3);
}

TEST(ApplyThreadsTest, CallersFromSeveralThreadsTakeTurns) {
  ApplyThreads threads(2);
  const int64_t n = 4 * ApplyThreads::kMinPart;
  std::vector<std::vector<int>> sums(2, std::vector<int>(n, 0));
  auto caller = [&](int who) {
    for (int round = 0; round < 50; ++round) {
      threads.Run(n, [&](int, int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) ++sums[who][i];
      });
    }
  };
  std::thread a(caller, 0), b(caller, 1);
  a.join();
  b.join();
  for (const std::vector<int>& s : sums) EXPECT_EQ(std::count(s.begin(), s.end(), 50), n);
}

// The default: half the CPUs of the caller's affinity mask, 1 to 8.
TEST(ApplyThreadsTest, AutoIsHalfTheCpusThisThreadMayUseFromOneToEight) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  EXPECT_EQ(ApplyThreads::Auto(), std::clamp(CPU_COUNT(&all) / 2, 1, 8));
  // Narrowed to its first k allowed CPUs (a thread of its own, so the test's mask stays).
  std::vector<int> allowed;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &all)) allowed.push_back(cpu);
  }
  for (size_t k : {size_t{1}, size_t{2}, size_t{4}, size_t{20}}) {
    if (k > allowed.size()) break;
    int got = -1;
    std::thread narrowed([&] {
      cpu_set_t some;
      CPU_ZERO(&some);
      for (size_t i = 0; i < k; ++i) CPU_SET(allowed[i], &some);
      if (sched_setaffinity(0, sizeof(some), &some) == 0) got = ApplyThreads::Auto();
    });
    narrowed.join();
    EXPECT_EQ(got, std::clamp(static_cast<int>(k) / 2, 1, 8)) << k << " CPUs";
  }
}

// The bound counts intermediate results too: with epsilon > 1, lr * g (AdaGrad) and lr * m (Adam)
// overflow before the division that would bring them back (found by review: the bound let them
// write -inf).
TEST(OptimizerTest, TheBoundCountsProductsBeforeTheDivision) {
  struct Case {
    const char* name;
    float epsilon, lr;
  };
  for (const Case& c : {Case{"adam", 100.0f, 1e22f}, Case{"adagrad", 1e4f, 1e30f}}) {
    SCOPED_TRACE(c.name);
    OptimizerConfig config;
    config.name = c.name;
    config.epsilon = c.epsilon;
    auto opt = MakeOptimizer(config, 1);
    ASSERT_TRUE(opt.ok());
    std::vector<float> w = {1.0f};
    std::vector<float> g = {1.0f};
    // Any first update: the magnitudes are then known and small.
    (*opt)->Apply(absl::MakeSpan(w), g, c.lr, 0, nullptr, 1.0f).IgnoreError();
    std::vector<float> before = w;
    g[0] = c.name[4] == 'g' ? 1e9f : 1e17f;  // "adagrad" / "adam"
    absl::Status s = (*opt)->Apply(absl::MakeSpan(w), g, c.lr, 1, nullptr, g[0]);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << w[0];
    EXPECT_EQ(w, before);
  }
}

TEST(OptimizerTest, ScanFindsTheFirstNonFiniteValue) {
  std::vector<float> g(300000, 0.5f);
  g[200001] = -INFINITY;
  g[250000] = NAN;
  ApplyThreads threads(3);
  EXPECT_EQ(ScanGradient(g, &threads).first_nonfinite, 200001);
  g[200001] = 2;
  GradientSummary scan = ScanGradient(g);
  EXPECT_EQ(scan.first_nonfinite, 250000);
  g[250000] = -4;
  scan = ScanGradient(g, &threads, /*squares=*/true);
  EXPECT_EQ(scan.first_nonfinite, -1);
  EXPECT_EQ(scan.max_abs, 4.0f);
  EXPECT_DOUBLE_EQ(scan.sum_of_squares, 299998 * 0.25 + 4 + 16);
}

// A gradient scanned run by run as it arrives (a payload source telling the shard of each run)
// sums up exactly as one pass, whatever the runs' lengths, whatever order its blocks come in and
// on however many threads, and finds the same first non-finite.
TEST(OptimizerTest, AScanFedInRunsOfAnyLengthAndBlockOrderIsOnePassBitForBit) {
  std::vector<float> g(3 * GradientScan::kBlock + 1000 * 16 + 7);
  for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(i * 0.77f) * (1 + i % 13) * 1e-3f;
  g[421] = 1e-39f;  // a denormal: read as zero by both (ScopedFlushDenormals)
  const auto all = absl::MakeConstSpan(g);
  for (bool squares : {false, true}) {
    const GradientSummary whole = ScanGradient(g, nullptr, squares);
    for (size_t run : {1, 5, 16, 17, 1000, 65536, 100000}) {
      GradientScan scan(all, squares);
      for (size_t i = 0; i < g.size(); i += run) scan.Add(all.subspan(i, run));
      EXPECT_EQ(scan.count(), static_cast<int64_t>(g.size()));
      const GradientSummary runs = scan.Finish();
      EXPECT_EQ(runs.max_abs, whole.max_abs) << run;
      EXPECT_EQ(runs.sum_of_squares, whole.sum_of_squares) << run;  // bit for bit
      EXPECT_EQ(runs.first_nonfinite, -1);
    }
    // The blocks last first, and two threads at once (each its own blocks, in runs of 1000).
    GradientScan backwards(all, squares);
    for (int64_t b = 3; b >= 0; --b)
      backwards.Add(all.subspan(b * GradientScan::kBlock, GradientScan::kBlock));
    EXPECT_EQ(backwards.Finish().sum_of_squares, whole.sum_of_squares);
    GradientScan two(all, squares);
    auto feed = [&](int64_t from, int64_t to) {
      for (int64_t i = from; i < to; i += 1000)
        two.Add(all.subspan(i, std::min<int64_t>(1000, to - i)));
    };
    std::thread other(feed, 2 * GradientScan::kBlock, static_cast<int64_t>(g.size()));
    feed(0, 2 * GradientScan::kBlock);
    other.join();
    EXPECT_EQ(two.count(), static_cast<int64_t>(g.size()));
    EXPECT_EQ(two.Finish().sum_of_squares, whole.sum_of_squares);
    EXPECT_EQ(two.Finish().max_abs, whole.max_abs);
  }
  g[9000] = NAN;
  GradientScan scan(all, true);
  scan.Add(all.subspan(8999));
  scan.Add(all.subspan(0, 8999));
  EXPECT_EQ(scan.Finish().first_nonfinite, 9000);
  EXPECT_EQ(ScanGradient(g).first_nonfinite, 9000);
}

TEST(OptimizerTest, RejectsUnknownNamesAndBadHyperParameters) {
  OptimizerConfig c;
  c.name = "rmsprop";
  EXPECT_EQ(MakeOptimizer(c, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(MakeOptimizer(c, 1).status().message().find("unknown optimizer 'rmsprop'"),
            std::string::npos);
  c.name = "momentum";
  c.momentum = 1.5f;
  EXPECT_FALSE(MakeOptimizer(c, 1).ok());
}

}  // namespace
}  // namespace ps
