// apply_bench: how fast a shard applies a push, per optimizer and thread count, against a plain
// streaming loop over the same arrays in the same run (the memory-bandwidth ceiling for that
// many reads and writes). Bytes are those the update must touch: the weights, the gradient and
// the optimizer state, each read once, and the weights and state written once.
//   apply_bench --params=10000000 --threads=1,2 --repeats=7
// Columns (GB/s of those bytes, median of --repeats):
//   push:    what the shard does per push: ScanGradient on one thread (non-finite check, bound)
//            + Apply
//   apply:   Apply alone, the bound proving the update finite (the usual case)
//   checked: Apply alone without a bound (a dry-run pass first: DC-ASGD, sync rounds, restores)
//   stream:  a loop reading and writing the same arrays, as many of each, with the same threads
#include <iostream>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/median_seconds.h"
#include "server/state/apply_threads.h"
#include "server/state/optimizer.h"

ABSL_FLAG(int64_t, params, 10'000'000, "Parameters in the shard.");
ABSL_FLAG(std::string, threads, "1,2", "Comma-separated thread counts (ps --apply_threads).");
ABSL_FLAG(std::string, optimizers, "sgd,momentum,nesterov,adam,adagrad", "Which to measure.");
ABSL_FLAG(int, repeats, 7, "Measurements per cell; the median is printed.");

namespace ps {
namespace {

// The ceiling: arrays[k][i] += arrays[k - 1][i] (arrays[-1] being g), for i in [begin, end): each
// array read once and written once, the gradient read once, in loops the compiler vectorises.
void Stream(std::vector<std::vector<float>>& arrays, const std::vector<float>& g, int64_t begin,
            int64_t end) {
  float* a = arrays[0].data();
  float* b = arrays.size() > 1 ? arrays[1].data() : nullptr;
  float* c = arrays.size() > 2 ? arrays[2].data() : nullptr;
  const float* x = g.data();
  switch (arrays.size()) {
    case 1:
      for (int64_t i = begin; i < end; ++i) a[i] += x[i];
      break;
    case 2:
      for (int64_t i = begin; i < end; ++i) b[i] = (a[i] += x[i]) + b[i];
      break;
    default:
      for (int64_t i = begin; i < end; ++i) c[i] = (b[i] = (a[i] += x[i]) + b[i]) + c[i];
  }
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "How fast a shard applies a push, per optimizer and thread count, against a streaming loop.\n"
      "  apply_bench --params=10000000 --threads=1,2 --repeats=7");
  absl::ParseCommandLine(argc, argv);
  const int64_t n = absl::GetFlag(FLAGS_params);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  std::vector<int> thread_counts;
  for (absl::string_view t : absl::StrSplit(absl::GetFlag(FLAGS_threads), ',')) {
    int k = 0;
    if (!absl::SimpleAtoi(t, &k) || k < 1 || k > ApplyThreads::kMaxThreads) {
      std::cerr << "bad --threads entry '" << t << "'\n";
      return 2;
    }
    thread_counts.push_back(k);
  }
  std::vector<float> w(n), g(n);
  for (int64_t i = 0; i < n; ++i) {
    w[i] = 0.01f * static_cast<float>(i % 97);
    g[i] = 0.001f * static_cast<float>(i % 89) - 0.04f;
  }
  absl::PrintF("apply_bench: %d parameters, median of %d\n", n, repeats);
  absl::PrintF("%-9s %7s %9s %8s %8s %8s %8s %8s %11s %11s\n", "optimizer", "threads", "MB/push",
               "push", "+norm", "apply", "checked", "stream", "push/strm", "apply/strm");
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_optimizers), ',', absl::SkipEmpty())) {
    OptimizerConfig config;
    config.name = std::string(name);
    absl::StatusOr<std::unique_ptr<Optimizer>> made = MakeOptimizer(config, n);
    if (!made.ok()) {
      std::cerr << made.status() << "\n";
      return 2;
    }
    Optimizer& opt = **made;
    const int slots = static_cast<int>(opt.State().size());
    // Read: weights, gradient, each slot; written: weights, each slot.
    const double bytes = 4.0 * n * ((2 + slots) + (1 + slots));
    // The streaming loop's arrays: as many (weights + slots) to update, and the gradient.
    std::vector<std::vector<float>> stream(1 + slots, std::vector<float>(n, 1.0f));
    for (int threads : thread_counts) {
      ApplyThreads pool(threads);
      int64_t step = 0;
      // A tiny rate keeps the weights where they are over many repetitions.
      const float lr = 1e-6f;
      auto apply = [&](float bound) {
        if (!opt.Apply(absl::MakeSpan(w), g, lr, step++, &pool, bound).ok()) std::abort();
      };
      apply(1.0f);  // the first update computes the magnitudes the bound needs
      const double push_s = MedianSeconds(repeats, [&] {
        GradientSummary scan = ScanGradient(g);  // as the shard: on the receiving thread
        apply(scan.max_abs);
      });
      // As the shard with --max_norm_ratio or --clip_norm: the scan also sums the squares.
      const double norm_s = MedianSeconds(repeats, [&] {
        GradientSummary scan = ScanGradient(g, nullptr, /*squares=*/true);
        apply(scan.max_abs);
      });
      const double apply_s = MedianSeconds(repeats, [&] { apply(1.0f); });
      const double checked_s =
          MedianSeconds(repeats, [&] { apply(std::numeric_limits<float>::infinity()); });
      const double stream_s = MedianSeconds(repeats, [&] {
        pool.Run(n, [&](int, int64_t begin, int64_t end) { Stream(stream, g, begin, end); });
      });
      auto gbs = [&](double s) { return bytes / s / 1e9; };
      absl::PrintF("%-9s %7d %9.0f %8.2f %8.2f %8.2f %8.2f %8.2f %11.2f %11.2f\n", name, threads,
                   bytes / 1e6, gbs(push_s), gbs(norm_s), gbs(apply_s), gbs(checked_s),
                   gbs(stream_s), stream_s / push_s, stream_s / apply_s);
    }
  }
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
