// checkpoint_bench: what a checkpoint costs a shard. The part that holds the shard's lock (and so
// stalls pushes) is the copy of values and optimizer state; the file is written outside it.
// Ceiling: memcpy of the same bytes in the same run.
//   checkpoint_bench --params=25000000 --optimizer=momentum --repeats=5
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/median_seconds.h"
#include "server/checkpoints/checkpoint_store.h"
#include "server/state/parameter_shard.h"

ABSL_FLAG(int64_t, params, 25'000'000, "Parameters in the shard (ResNet-50: ~25M).");
ABSL_FLAG(std::string, optimizer, "momentum", "sgd | momentum | nesterov | adam | adagrad.");
ABSL_FLAG(int, repeats, 5, "Measurements per row; the median is printed.");
ABSL_FLAG(std::string, dir, "/tmp/checkpoint-bench", "Where to write the checkpoints.");

namespace ps {
namespace {

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "What a checkpoint costs a shard (the copy under its lock, the file), against memcpy.\n"
      "  checkpoint_bench");
  absl::ParseCommandLine(argc, argv);
  const int64_t n = absl::GetFlag(FLAGS_params);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  ShardConfig config;
  config.model = absl::StrCat("flat:", n);
  config.num_workers = 1;
  config.optimizer.name = absl::GetFlag(FLAGS_optimizer);
  absl::StatusOr<std::unique_ptr<ParameterShard>> shard = ParameterShard::Create(config);
  if (!shard.ok()) {
    std::cerr << shard.status() << "\n";
    return 1;
  }
  const ModelIdentity model{config.model, n, 1};
  std::vector<float> values(n, 0.5f);
  if (!(*shard)->Initialize(model, 0, values).ok() || !(*shard)->Register(0, model).ok() ||
      !(*shard)
           ->Push({0, 0, 0, 0, n, (*shard)->Stats().workers[0].incarnation},
                  std::vector<float>(n, 0.01f))
           .ok()) {
    std::cerr << "cannot set up the shard\n";
    return 1;
  }
  ShardState c;
  absl::Time start = absl::Now();
  if (!(*shard)->Checkpoint(&c).ok()) return 1;
  const double first_s = absl::ToDoubleSeconds(absl::Now() - start);  // into fresh memory
  const size_t bytes = c.header.tensors_size() * n * sizeof(float);
  std::vector<char> from(bytes, 1), to(bytes);
  double memcpy_s = MedianSeconds(repeats, [&] { std::memcpy(to.data(), from.data(), bytes); });
  double copy_s = MedianSeconds(repeats, [&] {
    if (!(*shard)->Checkpoint(&c).ok()) std::abort();
  });
  CheckpointStore store(absl::GetFlag(FLAGS_dir), 0, 1);
  double write_s = MedianSeconds(repeats, [&] {
    if (!store.Write(c).ok()) std::abort();
  });
  std::cout << absl::StrFormat(
      "| params | optimizer | bytes copied | memcpy | copy under the lock (first) | ratio | file "
      "write (outside the lock) |\n|---|---|---|---|---|---|---|\n"
      "| %d | %s | %.0f MB | %.1f ms | %.1f ms (%.1f ms) | %.2f | %.0f ms (%.2f GB/s) |\n",
      n, config.optimizer.name, bytes / 1e6, memcpy_s * 1e3, copy_s * 1e3, first_s * 1e3,
      copy_s / memcpy_s, write_s * 1e3, bytes / write_s / 1e9);
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
