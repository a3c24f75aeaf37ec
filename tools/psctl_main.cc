// psctl: a running job at a glance. `psctl status` prints every shard (address, role, version,
// updates/s, workers, staleness, drops) and every worker (clock, last seen) as a table;
// --watch=S refreshes it every S seconds until SIGINT/SIGTERM. `psctl spec --cluster=FILE`
// prints what the cluster spec makes each role (every daemon's flags), contacting nothing.
#include <cstdio>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cluster_spec.h"
#include "common/log.h"
#include "common/model_spec.h"
#include "common/shutdown.h"
#include "tools/job_status.h"
#include "worker/client_flags.h"
#include "worker/shard_stats.h"

ABSL_DECLARE_FLAG(std::string, cluster);  // common/cluster_spec.cc

ABSL_FLAG(double, watch, 0, "Refresh every this many seconds until interrupted; 0: print once.");
ABSL_FLAG(double, interval, 1, "Seconds between the two readings that updates/s comes from.");

namespace ps {
namespace {

int Fail(const std::string& reason) { return FailMain("psctl", reason); }

int Main(int argc, char** argv) {
  absl::StatusOr<ParsedCommandLine> parsed = ParseDaemonFlags(
      argc, argv, "psctl",
      "A running job at a glance.\nExamples: psctl status --cluster=cluster.json [--watch=2]\n"
      "          psctl status --ps=host1:50051,host2:50051 --token_file=read-token\n"
      "          psctl spec --cluster=cluster.json   (each role's flags, from the spec)");
  if (!parsed.ok()) return Fail(std::string(parsed.status().message()));
  if (parsed->positional == std::vector<std::string>{"spec"}) {
    if (absl::GetFlag(FLAGS_cluster).empty()) return Fail("psctl spec needs --cluster=FILE");
    absl::StatusOr<ClusterSpec> spec = ReadClusterSpec(absl::GetFlag(FLAGS_cluster));
    absl::StatusOr<std::string> roles =
        spec.ok() ? DescribeRoles(*spec) : absl::StatusOr<std::string>(spec.status());
    if (!roles.ok()) return Fail(std::string(roles.status().message()));
    std::printf("%s", roles->c_str());
    return 0;
  }
  if (parsed->positional != std::vector<std::string>{"status"}) {
    return Fail("expected one command: status or spec (see --help)");
  }
  const double watch = absl::GetFlag(FLAGS_watch), interval = absl::GetFlag(FLAGS_interval);
  if (!(watch >= 0) || !(interval > 0)) return Fail("--watch must be >= 0 and --interval > 0");
  SetLogTag("psctl");
  absl::StatusOr<ClientConnection> shards = ClientConnectionFromFlags(/*needs_shards=*/true);
  if (!shards.ok()) return Fail(std::string(shards.status().message()));
  InstallShutdownHandler();
  ShardedClient client(
      shards->addresses,
      {MlpSpec(shards->layer_sizes), 0, static_cast<int>(shards->addresses.size())},
      /*worker_id=*/-1, shards->options);
  CancelOnShutdown cancel_on_shutdown(&client);
  absl::StatusOr<std::vector<v1::StatsResponse>> before = FetchStats(client);
  if (!before.ok()) return Fail(std::string(before.status().message()));
  absl::Time before_at = absl::Now();
  for (;;) {
    if (WaitForShutdown(absl::Seconds(watch > 0 ? watch : interval))) return 0;
    absl::StatusOr<std::vector<v1::StatsResponse>> now = FetchStats(client);
    if (!now.ok()) {
      if (ShutdownRequested()) return 0;
      return Fail(std::string(now.status().message()));
    }
    const absl::Time now_at = absl::Now();
    if (watch > 0) std::printf("\033[H\033[2J");  // clear the terminal between refreshes
    std::printf("%s", StatusTable(shards->addresses, *now, &*before,
                                  absl::ToDoubleSeconds(now_at - before_at))
                          .c_str());
    std::fflush(stdout);
    if (watch == 0) return 0;
    before = std::move(now);
    before_at = now_at;
  }
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
