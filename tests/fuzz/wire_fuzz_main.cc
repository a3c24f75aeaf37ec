// wire_fuzz: sends malformed requests of every ps.v1 method to a live shard (by default, shard 1
// of two it starts itself) and checks the wire contract (see tests/fuzz/wire_fuzzer.h): no crash,
// no hang, no INTERNAL or UNKNOWN, the weights unchanged. Prints the status codes per method and
// exits 0 if the contract held.
//
//   build/bin/wire_fuzz --requests=10000 --seed=1
//   # an initialised cluster nobody else is using:
//   build/bin/wire_fuzz --ps=hostA:50051,hostB:50051 --shard=1 --fingerprint=mlp:784-256-128-10
//       --total_params=235146
#include <stdlib.h>

#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/cluster.h"
#include "common/log.h"
#include "tests/fuzz/wire_fuzzer.h"

ABSL_FLAG(int64_t, requests, 10000, "Malformed requests to send.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the request generator.");
ABSL_FLAG(std::string, ps, "",
          "Shard addresses of a running, initialised cluster that nothing else writes to; empty: "
          "start two shards here and fuzz shard 1.");
ABSL_FLAG(int, shard, 0, "With --ps: the shard to send the requests to.");
ABSL_FLAG(std::string, fingerprint, "", "With --ps: the model's fingerprint.");
ABSL_FLAG(int64_t, total_params, 20000, "The model's size (with --ps: as the cluster holds it).");
ABSL_FLAG(double, deadline_seconds, 10, "Deadline of every call.");

namespace ps {
namespace {

int Fail(const std::string& reason) { return FailMain("wire_fuzz", reason); }

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Sends malformed requests to a ps shard and checks it answers them all properly.\n"
      "Example: wire_fuzz --requests=10000 --seed=1");
  absl::ParseCommandLine(argc, argv);
  std::unique_ptr<LocalCluster> cluster;
  FuzzTarget target;
  if (absl::GetFlag(FLAGS_ps).empty()) {
    std::string pattern = "/tmp/wire-fuzz-XXXXXX";
    cluster = std::make_unique<LocalCluster>(ExecutableDir(), mkdtemp(pattern.data()));
    absl::StatusOr<FuzzTarget> started =
        StartFuzzCluster(*cluster, absl::GetFlag(FLAGS_total_params));
    if (!started.ok()) return Fail(std::string(started.status().message()));
    target = *std::move(started);
  } else {
    absl::StatusOr<std::vector<std::string>> addresses =
        ParseShardAddresses(absl::GetFlag(FLAGS_ps));
    if (!addresses.ok()) return Fail(std::string(addresses.status().message()));
    target.addresses = *addresses;
    target.shard = absl::GetFlag(FLAGS_shard);
    target.model = {absl::GetFlag(FLAGS_fingerprint), absl::GetFlag(FLAGS_total_params),
                    static_cast<int>(addresses->size())};
    if (target.shard < 0 || target.shard >= static_cast<int>(addresses->size())) {
      return Fail(
          absl::StrCat("--shard=", target.shard, " is not in [0, ", addresses->size(), ")"));
    }
  }
  FuzzOptions options;
  options.requests = absl::GetFlag(FLAGS_requests);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.deadline = absl::Seconds(absl::GetFlag(FLAGS_deadline_seconds));
  std::cout << "wire_fuzz: " << options.requests << " requests, seed " << options.seed
            << ", to shard " << target.shard << " at " << target.addresses[target.shard]
            << std::endl;
  absl::StatusOr<FuzzReport> report = RunWireFuzz(target, options);
  if (!report.ok()) return Fail(std::string(report.status().message()));
  // A shard started here is watched as a process; one given by --ps answered the final pull.
  bool alive = cluster == nullptr || cluster->shards()[target.shard].running();
  std::cout << report->Table() << report->Summary()
            << "shard process: " << (alive ? "running" : "GONE (see its log)") << "\n";
  if (!alive || !report->Held()) {
    std::cout << "wire_fuzz: the contract was broken"
              << (cluster ? "; shard logs in " + cluster->run_dir() : "") << "\n";
    return 1;
  }
  std::cout << "wire_fuzz: the contract held\n";
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
