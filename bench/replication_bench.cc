// What replication costs a push across hosts: one client on an emulated host (tests/netns/
// virtual_hosts.h, every link --rate_gbit) pushing a --params float32 tensor over the data plane
// to a shard on another host, three ways: unreplicated; replicated (ps --peer, its backup on a
// third host) sending each change once it was applied (ps --forward_pushes=false: the bytes cross
// two links in turn); and replicated forwarding the push to the backup as it arrives (the
// default). The median push time of each, its rate, and both against iperf3's single stream from
// the client's host to the shard's on the same links in the same run. Needs root (namespaces).
//
//   sudo build/bin/replication_bench --rate_gbit=1 --params=10000000 --rounds=3

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/iperf3.h"
#include "bench/median_seconds.h"
#include "common/log.h"
#include "deploy/subprocess.h"
#include "tests/netns/virtual_hosts.h"
#include "worker/sharded_client.h"

ABSL_FLAG(double, rate_gbit, 1, "Every host's link, Gbit/s.");
ABSL_FLAG(int64_t, params, 10'000'000, "The tensor pushed: float32 values (one shard's).");
ABSL_FLAG(int, repeats, 7, "Timed pushes per run (the median is reported).");
ABSL_FLAG(int, rounds, 2,
          "Runs of each way, all three in turn before the next round (so that a drift of the "
          "machine spreads over them); the table gives each run.");
ABSL_FLAG(std::string, run_dir, "/tmp/replication_bench", "Logs of the runs.");
ABSL_FLAG(std::string, push_to, "",
          "Internal: be the client, pushing to the shard at this address (\"a/b\": replicated) "
          "and printing the median push time.");

namespace ps {
namespace {

constexpr int kPort = 50051;

// The client's side (--push_to), run on host 0: registers, initialises, pushes twice to warm up,
// then times --repeats pushes. Prints "push_seconds=S".
int PushTo(const std::string& address) {
  const int64_t n = absl::GetFlag(FLAGS_params);
  const ModelIdentity model{absl::StrCat("flat:", n), n, 1};
  ClientOptions options;
  options.shared_memory = false;  // another host
  ShardedClient client({address}, model, 0, options);
  if (absl::Status s = client.Register().status(); !s.ok())
    return FailMain("push_to", s.ToString());
  if (absl::Status s = client.Initialize(std::vector<float>(n, 0.5f)).status(); !s.ok()) {
    return FailMain("push_to", s.ToString());
  }
  const std::vector<float> gradient(n, 0.001f);
  bool failed = false;
  auto push = [&] { failed = failed || !client.Push(gradient).ok(); };
  push();
  push();
  const double seconds = MedianSeconds(absl::GetFlag(FLAGS_repeats), push);
  if (failed) return FailMain("push_to", "a push failed");
  std::cout << "push_seconds=" << seconds << "\n";
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

// One run of `way` on `hosts`: the shard (and its backup) started, the client run; the median
// push time.
absl::StatusOr<double> Run(const VirtualHosts& hosts, const Way& way, const std::string& dir) {
  const std::string primary = absl::StrCat(hosts.Address(1), ":", kPort);
  const std::string backup = absl::StrCat(hosts.Address(2), ":", kPort);
  std::vector<Subprocess> shards;
  for (int replica = 0; replica < (way.replicated ? 2 : 1); ++replica) {
    std::vector<std::string> argv = {ExecutableDir() + "/ps",
                                     absl::StrCat("--model=flat:", absl::GetFlag(FLAGS_params)),
                                     "--num_workers=1",
                                     "--optimizer=sgd",
                                     "--lr=0.01",
                                     "--insecure",
                                     absl::StrCat("--host=", hosts.Address(1 + replica)),
                                     absl::StrCat("--port=", kPort)};
    if (way.replicated) {
      argv.push_back(absl::StrCat("--peer=", replica == 0 ? backup : primary));
      argv.push_back(absl::StrCat("--replica=", replica));
      argv.push_back(absl::StrCat("--forward_pushes=", way.forward));
    }
    absl::StatusOr<Subprocess> p =
        Subprocess::Start(hosts.On(1 + replica, argv), absl::StrCat(dir, "/ps-", replica, ".log"));
    if (!p.ok()) return p.status();
    shards.push_back(*std::move(p));
  }
  const std::string log = dir + "/client.log";
  absl::StatusOr<Subprocess> client = Subprocess::Start(
      hosts.On(0, {ExecutableDir() + "/replication_bench",
                   absl::StrCat("--push_to=", primary, way.replicated ? "/" + backup : ""),
                   absl::StrCat("--params=", absl::GetFlag(FLAGS_params)),
                   absl::StrCat("--repeats=", absl::GetFlag(FLAGS_repeats))}),
      log);
  if (!client.ok()) return client.status();
  absl::StatusOr<int> code = client->Wait(absl::Minutes(10));
  for (Subprocess& s : shards) s.Stop(absl::Seconds(30));
  if (!code.ok() || *code != 0) {
    return absl::InternalError(absl::StrCat("the client failed; see ", log));
  }
  std::ifstream in(log);
  std::string line;
  double seconds = 0;
  while (std::getline(in, line)) {
    if (line.rfind("push_seconds=", 0) == 0 &&
        absl::SimpleAtod(line.substr(sizeof("push_seconds=") - 1), &seconds)) {
      return seconds;
    }
  }
  return absl::InternalError(absl::StrCat("the client reported no time; see ", log));
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Replication's cost to a push across emulated hosts (needs root).\n"
      "  sudo replication_bench --rate_gbit=1 --params=10000000 --rounds=3");
  absl::ParseCommandLine(argc, argv);
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
  const double bytes = absl::GetFlag(FLAGS_params) * 4.0;
  std::cout << absl::StrFormat(
      "%.1f MB pushes, links %s, one TCP stream (iperf3) %.3f GB/s: the bytes alone %.3f s\n",
      bytes / 1e6, shape.Describe(), *tcp, bytes / 1e9 / *tcp);
  std::cout << absl::StrFormat("%-36s | %-6s | %-9s | %-8s | %-8s | %s\n", "way", "round", "push s",
                               "GB/s", "/TCP", "/unreplicated");
  std::map<int, double> unreplicated;  // by round
  int failures = 0;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (const Way& way : kWays) {
      const std::string run_dir = absl::StrCat(dir, "/", round, "-", &way - kWays);
      std::filesystem::create_directories(run_dir);
      absl::StatusOr<double> s = Run(hosts, way, run_dir);
      if (!s.ok()) {
        std::cout << absl::StrFormat("%-36s | %-6d | failed: %s\n", way.name, round,
                                     s.status().message());
        ++failures;
        continue;
      }
      if (!way.replicated) unreplicated[round] = *s;
      const double gbs = bytes / 1e9 / *s;
      std::cout << absl::StrFormat(
          "%-36s | %-6d | %-9.3f | %-8.3f | %-8.2f | %s\n", way.name, round, *s, gbs, gbs / *tcp,
          unreplicated.count(round) ? absl::StrFormat("%.2fx the time", *s / unreplicated[round])
                                    : "-");
      std::cout.flush();
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
