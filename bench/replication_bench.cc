// What replication costs a push across hosts: --workers clients on an emulated host (tests/netns/
// virtual_hosts.h, every link --rate_gbit), each pushing a --params float32 tensor over the data
// plane to a shard on another host, all at once, three ways: unreplicated; replicated (ps --peer,
// its backup on a third host) sending each change once it was applied (ps --forward_pushes=false:
// the bytes cross two links in turn); and replicated forwarding the push to the backup as it
// arrives (the default). For each, the median time the clients' pushes take together (from their
// start to the last one's end), the rate that makes, and both against iperf3's single stream from
// the clients' host to the shard's on the same links in the same run, and the backup's peak
// resident memory (stages it held included). Needs root (namespaces).
//
//   sudo build/bin/replication_bench --rate_gbit=1 --params=10000000 --rounds=3 [--workers=2]
//       [--forward_at_once=N]

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/iperf3.h"
#include "bench/proc_status.h"
#include "common/log.h"
#include "deploy/subprocess.h"
#include "tests/netns/virtual_hosts.h"
#include "client/sharded_client.h"

ABSL_FLAG(double, rate_gbit, 1, "Every host's link, Gbit/s.");
ABSL_FLAG(int64_t, params, 10'000'000, "The tensor pushed: float32 values (one shard's).");
ABSL_FLAG(int, workers, 1, "Clients pushing at once, each its own process (on one host).");
ABSL_FLAG(int, forward_at_once, 0,
          "ps --forward_at_once of the replicated runs: pushes forwarded at once (0: ps's "
          "default, 2).");
ABSL_FLAG(int, repeats, 7, "Timed pushes per client and run (the median is reported).");
ABSL_FLAG(int, rounds, 2,
          "Runs of each way, all three in turn before the next round (so that a drift of the "
          "machine spreads over them); the table gives each run.");
ABSL_FLAG(std::string, run_dir, "/tmp/replication_bench", "Logs of the runs.");
ABSL_FLAG(std::string, push_to, "",
          "Internal: be a client, pushing to the shard at this address (\"a/b\": replicated) "
          "and printing each push's time.");
ABSL_FLAG(int, worker, 0, "Internal: the client's worker id.");
ABSL_FLAG(int64_t, start_at_us, 0, "Internal: when the clients' first push starts (Unix us).");
ABSL_FLAG(int64_t, period_ms, 0, "Internal: the time between one push's start and the next's.");

namespace ps {
namespace {

constexpr int kPort = 50051;

constexpr absl::Duration kStartDelay = absl::Seconds(10);  // for the clients to get ready
constexpr int kWarmUp = 2;                                 // pushes not timed

// A client's side (--push_to, --worker), run on host 0: registers, initialises, pushes twice to
// warm up, then --repeats pushes, push k starting at --start_at_us + k * --period_ms on every
// client (so that the clients push at once, as after a step's compute). Prints
// "push=K seconds=S" for each timed push: from its scheduled start to its end.
int PushTo(const std::string& address) {
  const int64_t n = absl::GetFlag(FLAGS_params);
  const ModelIdentity model{absl::StrCat("flat:", n), n, 1};
  ClientOptions options;
  options.shared_memory = false;  // another host
  ShardedClient client({address}, model, absl::GetFlag(FLAGS_worker), options);
  if (absl::Status s = client.Register().status(); !s.ok())
    return FailMain("push_to", s.ToString());
  if (absl::Status s = client.Initialize(std::vector<float>(n, 0.5f)).status(); !s.ok()) {
    return FailMain("push_to", s.ToString());
  }
  const std::vector<float> gradient(n, 0.001f);
  const absl::Time start = absl::FromUnixMicros(absl::GetFlag(FLAGS_start_at_us));
  const absl::Duration period = absl::Milliseconds(absl::GetFlag(FLAGS_period_ms));
  if (absl::Now() > start) {
    return FailMain("push_to", absl::StrCat("not ready ", absl::FormatDuration(kStartDelay),
                                            " after starting: the pushes would not be at once"));
  }
  for (int k = 0; k < kWarmUp + absl::GetFlag(FLAGS_repeats); ++k) {
    const absl::Time at = start + k * period;
    absl::SleepFor(at - absl::Now());  // (none if late: that counts in its time)
    if (absl::Status s = client.Push(gradient).status(); !s.ok()) {
      return FailMain("push_to", s.ToString());
    }
    if (k >= kWarmUp) {
      std::cout << "push=" << k - kWarmUp << " seconds=" << absl::ToDoubleSeconds(absl::Now() - at)
                << "\n";
    }
  }
  return 0;
}

struct Way {
  const char* name;
  bool replicated;
  bool forward;
};
constexpr Way kWays[] = {{"unreplicated", false, true},
                         {"replicated, sent once applied", true, false},
                         {"replicated, forwarded as it arrives", true, true}};

// What a run measured: the median over its pushes of the time from their start to the last
// client's push's end; the backup's peak resident memory (VmHWM, MiB; -1: none).
struct Measured {
  double seconds = 0;
  double backup_peak_mib = -1;
};

// One run of `way` on `hosts`: the shard (and its backup) started, the clients run, their pushes
// `period` apart.
absl::StatusOr<Measured> Run(const VirtualHosts& hosts, const Way& way, absl::Duration period,
                             const std::string& dir) {
  const std::string primary = absl::StrCat(hosts.Address(1), ":", kPort);
  const std::string backup = absl::StrCat(hosts.Address(2), ":", kPort);
  const int workers = absl::GetFlag(FLAGS_workers);
  std::vector<Subprocess> shards;
  for (int replica = 0; replica < (way.replicated ? 2 : 1); ++replica) {
    std::vector<std::string> argv = {ExecutableDir() + "/ps",
                                     absl::StrCat("--model=flat:", absl::GetFlag(FLAGS_params)),
                                     absl::StrCat("--num_workers=", workers),
                                     "--optimizer=sgd",
                                     "--lr=0.01",
                                     "--insecure",
                                     absl::StrCat("--host=", hosts.Address(1 + replica)),
                                     absl::StrCat("--port=", kPort)};
    if (way.replicated) {
      argv.push_back(absl::StrCat("--peer=", replica == 0 ? backup : primary));
      argv.push_back(absl::StrCat("--replica=", replica));
      argv.push_back(absl::StrCat("--forward_pushes=", way.forward));
      if (const int n = absl::GetFlag(FLAGS_forward_at_once); n > 0) {
        argv.push_back(absl::StrCat("--forward_at_once=", n));
      }
    }
    absl::StatusOr<Subprocess> p =
        Subprocess::Start(hosts.On(1 + replica, argv), absl::StrCat(dir, "/ps-", replica, ".log"));
    if (!p.ok()) return p.status();
    shards.push_back(*std::move(p));
  }
  std::vector<Subprocess> clients;
  const absl::Time start = absl::Now() + kStartDelay;
  for (int worker = 0; worker < workers; ++worker) {
    absl::StatusOr<Subprocess> client = Subprocess::Start(
        hosts.On(0, {ExecutableDir() + "/replication_bench",
                     absl::StrCat("--push_to=", primary, way.replicated ? "/" + backup : ""),
                     absl::StrCat("--worker=", worker),
                     absl::StrCat("--start_at_us=", absl::ToUnixMicros(start)),
                     absl::StrCat("--period_ms=", absl::ToInt64Milliseconds(period)),
                     absl::StrCat("--params=", absl::GetFlag(FLAGS_params)),
                     absl::StrCat("--repeats=", absl::GetFlag(FLAGS_repeats))}),
        absl::StrCat(dir, "/client-", worker, ".log"));
    if (!client.ok()) return client.status();
    clients.push_back(*std::move(client));
  }
  std::vector<absl::StatusOr<int>> codes;
  for (Subprocess& client : clients) codes.push_back(client.Wait(absl::Minutes(10)));
  Measured measured;
  if (way.replicated) measured.backup_peak_mib = ProcStatusMiB(shards[1].pid(), "VmHWM");
  for (Subprocess& s : shards) s.Stop(absl::Seconds(30));
  const int repeats = absl::GetFlag(FLAGS_repeats);
  std::vector<double> seconds(repeats, 0);  // by push: the slowest client's
  for (int worker = 0; worker < workers; ++worker) {
    const std::string log = absl::StrCat(dir, "/client-", worker, ".log");
    if (!codes[worker].ok() || *codes[worker] != 0) {
      return absl::InternalError(absl::StrCat("a client failed; see ", log));
    }
    std::ifstream in(log);
    int timed = 0;
    for (std::string line; std::getline(in, line);) {
      int k = 0;
      double s = 0;
      if (std::sscanf(line.c_str(), "push=%d seconds=%lf", &k, &s) == 2 && k >= 0 && k < repeats) {
        seconds[k] = std::max(seconds[k], s);
        ++timed;
      }
    }
    if (timed != repeats) {
      return absl::InternalError(
          absl::StrCat("a client reported ", timed, " of ", repeats, " push times; see ", log));
    }
  }
  std::sort(seconds.begin(), seconds.end());
  measured.seconds = seconds[seconds.size() / 2];
  return measured;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Replication's cost to a push across emulated hosts (needs root).\n"
      "  sudo replication_bench --rate_gbit=1 --params=10000000 --rounds=3 [--workers=2]");
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_workers) < 1 || absl::GetFlag(FLAGS_repeats) < 1) {
    return FailMain("replication_bench", "--workers and --repeats must be at least 1");
  }
  if (const std::string address = absl::GetFlag(FLAGS_push_to); !address.empty()) {
    return PushTo(address);
  }
  const std::string dir = absl::GetFlag(FLAGS_run_dir);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const LinkShape shape{.rate_gbit = absl::GetFlag(FLAGS_rate_gbit)};
  absl::StatusOr<std::unique_ptr<VirtualHosts>> made =
      VirtualHosts::Create(3, shape, ExecutableDir() + "/netdelay", dir);
  if (!made.ok()) return FailMain("replication_bench", made.status().ToString());
  const VirtualHosts& hosts = **made;
  auto on = [&hosts](int host) {
    return [&hosts, host](std::vector<std::string> argv) { return hosts.On(host, argv); };
  };
  // The ceiling: one TCP stream from the client's host to the shard's.
  absl::StatusOr<double> tcp = Iperf3GBs(dir, 3, hosts.Address(1), 5201, on(1), on(0));
  if (!tcp.ok()) return FailMain("replication_bench", tcp.status().ToString());
  const int workers = absl::GetFlag(FLAGS_workers);
  const double bytes = absl::GetFlag(FLAGS_params) * 4.0 * workers;  // a push from each
  std::cout << absl::StrFormat(
      "%d x %.1f MB pushes at once, links %s, one TCP stream (iperf3) %.3f GB/s: the bytes alone "
      "%.3f s\n",
      workers, bytes / workers / 1e6, shape.Describe(), *tcp, bytes / 1e9 / *tcp);
  std::cout << absl::StrFormat("%-36s | %-6s | %-9s | %-8s | %-8s | %-15s | %s\n", "way", "round",
                               "push s", "GB/s", "/TCP", "/unreplicated", "backup peak MiB");
  // Pushes start this far apart: room for all of them, sent once applied, twice over.
  const absl::Duration period = std::max(absl::Seconds(1), absl::Seconds(4 * bytes / 1e9 / *tcp));
  std::map<int, double> unreplicated;  // by round
  int failures = 0;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (const Way& way : kWays) {
      const std::string run_dir = absl::StrCat(dir, "/", round, "-", &way - kWays);
      std::filesystem::create_directories(run_dir);
      absl::StatusOr<Measured> m = Run(hosts, way, period, run_dir);
      if (!m.ok()) {
        std::cout << absl::StrFormat("%-36s | %-6d | failed: %s\n", way.name, round,
                                     m.status().message());
        ++failures;
        continue;
      }
      const double s = m->seconds;
      if (!way.replicated) unreplicated[round] = s;
      const double gbs = bytes / 1e9 / s;
      std::cout << absl::StrFormat(
          "%-36s | %-6d | %-9.3f | %-8.3f | %-8.2f | %-15s | %s\n", way.name, round, s, gbs,
          gbs / *tcp,
          unreplicated.count(round) ? absl::StrFormat("%.2fx the time", s / unreplicated[round])
                                    : "-",
          m->backup_peak_mib >= 0 ? absl::StrFormat("%.0f", m->backup_peak_mib) : "-");
      std::cout.flush();
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
