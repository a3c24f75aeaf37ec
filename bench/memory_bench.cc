// memory_bench: what a shard process holds beside its values and optimizer state. Starts a real
// ps for --params parameters, initialises it, runs push + pull rounds with one client, and reads
// the process's resident set (VmRSS) and its peak (VmHWM) from /proc at each phase. Busy, a shard
// also holds one shard-sized buffer per push and per pull in flight and keeps two of each for
// reuse; once they have gone unused for ParameterShard::kBuffersUnused it should hold its values
// and state and the empty process's overhead, no more.
//   memory_bench --params=100000000 --optimizer=momentum --rounds=5
#include <stdlib.h>

#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/proc_status.h"
#include "deploy/local_cluster.h"
#include "server/state/parameter_shard.h"
#include "client/sharded_client.h"

ABSL_FLAG(int64_t, params, 100'000'000, "Parameters in the (single) shard.");
ABSL_FLAG(std::string, optimizer, "momentum", "sgd | momentum | nesterov | adam | adagrad.");
ABSL_FLAG(int, rounds, 5, "Push + pull rounds while busy.");

namespace ps {
namespace {

// VmRSS and VmHWM of `pid` in bytes.
struct Resident {
  double rss = 0, peak = 0;
};
Resident ReadResident(pid_t pid) {
  return {ProcStatusMiB(pid, "VmRSS") * (1 << 20), ProcStatusMiB(pid, "VmHWM") * (1 << 20)};
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "What a shard process holds beside its values and optimizer state, phase by phase.\n"
      "  memory_bench");
  absl::ParseCommandLine(argc, argv);
  const int64_t n = absl::GetFlag(FLAGS_params);
  const std::string optimizer = absl::GetFlag(FLAGS_optimizer);
  const int slots = optimizer == "sgd" ? 0 : optimizer == "adam" ? 2 : 1;
  const double state_bytes = 4.0 * n * (1 + slots);
  std::string dir_pattern = "/tmp/memory-bench-XXXXXX";
  LocalCluster cluster(ExecutableDir(), mkdtemp(dir_pattern.data()));
  const ModelIdentity model{absl::StrCat("flat:", n), n, 1};
  if (absl::Status s = cluster.StartShards(1, model.fingerprint, 1,
                                           {"--optimizer=" + optimizer, "--lr=0.000001"});
      !s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  const pid_t pid = cluster.shards()[0].pid();
  ShardedClient client({cluster.ShardAddress(0)}, model, 0);
  std::vector<float> params(n, 0.5f), grad(n, 0.001f);
  absl::PrintF("memory_bench: ps with %d parameters, %s: values + state = %.0f MB\n", n, optimizer,
               state_bytes / 1e6);
  absl::PrintF("%-34s %9s %9s %24s\n", "phase", "RSS MB", "peak MB",
               "(RSS - empty)/(values+state)");
  const Resident empty = ReadResident(pid);
  auto row = [&](const std::string& phase) {
    Resident r = ReadResident(pid);
    absl::PrintF("%-34s %9.0f %9.0f %24.2f\n", phase, r.rss / 1e6, r.peak / 1e6,
                 (r.rss - empty.rss) / state_bytes);
  };
  row("started, empty");
  if (!client.Register().ok() || !client.Initialize(params).ok()) {
    std::cerr << "cannot initialise the shard\n";
    return 1;
  }
  row("initialised");
  const int rounds = absl::GetFlag(FLAGS_rounds);
  for (int round = 0; round < rounds; ++round) {
    if (!client.Push(grad).ok() || !client.Pull(absl::MakeSpan(params)).ok()) {
      std::cerr << "push or pull failed\n";
      return 1;
    }
  }
  row(absl::StrCat("after ", rounds, " push + pull"));
  absl::SleepFor(ParameterShard::kBuffersUnused + absl::Seconds(2));
  row(absl::StrCat("idle ",
                   absl::FormatDuration(ParameterShard::kBuffersUnused + absl::Seconds(2))));
  cluster.Stop();
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
