// load_bench: many concurrent clients (ShardedClient, each its own worker id) pulling the whole
// model and pushing a gradient in a loop against an async cluster, for a fixed time. Reports
// errors, acknowledged pushes against the pushes each shard says it applied, push and pull
// latency percentiles, pushes/s, and the shard processes' memory (VmRSS, VmHWM).
//
//   build/bin/load_bench --clients=64 --seconds=60
//   build/bin/load_bench --clients=16 --replicas=2   # every push acknowledged by a backup too
//   build/bin/load_bench --ps=hostA:50051,hostB:50051   # a running async cluster of this model
//   build/bin/load_bench --credentials=worker           # each client with its own token
#include <stdlib.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/proc_status.h"
#include "common/cluster.h"
#include "common/log.h"
#include "transport/security.h"
#include "deploy/local_cluster.h"
#include "proto/ps.pb.h"
#include "client/sharded_client.h"

ABSL_FLAG(int, clients, 64, "Concurrent clients, worker ids 0 .. clients-1.");
ABSL_FLAG(double, seconds, 60, "How long the clients push and pull.");
ABSL_FLAG(int64_t, params, 300000, "Model size (float32 parameters), split over the shards.");
ABSL_FLAG(int, shards, 2, "Shards to start (async, momentum) when --ps is empty.");
ABSL_FLAG(int, replicas, 1, "Processes per shard started: 2 replicates each (ps --peer).");
ABSL_FLAG(std::vector<std::string>, ps_flags, {},
          "Extra flags for the shards started here, comma-separated.");
ABSL_FLAG(std::string, ps, "",
          "Shard addresses of a running async cluster (fresh, or holding this benchmark's model); "
          "empty: start --shards shards here.");

ABSL_FLAG(std::string, credentials, "none",
          "Shards started here: none | token (every client sends the job's write token) | worker "
          "(ps --worker_identity: client i sends worker i's own token).");

namespace ps {
namespace {

int Fail(const std::string& reason) { return FailMain("load_bench", reason); }

// What one client saw.
struct ClientResult {
  std::vector<absl::Duration> push_latency, pull_latency;
  int64_t acknowledged = 0;  // pushes answered OK (each applied once, retries or not)
  int64_t duplicates = 0;    // shards that answered a retried push as already applied
  int64_t errors = 0;
  std::string first_error;
};

ClientResult RunClient(const std::vector<std::string>& addresses, const ModelIdentity& model,
                       int worker_id, const ClientOptions& options, absl::Time stop) {
  ClientResult r;
  ShardedClient client(addresses, model, worker_id, options);
  auto failed = [&](const absl::Status& s) {
    if (r.errors++ == 0) r.first_error = absl::StrCat("worker ", worker_id, ": ", s.ToString());
  };
  absl::StatusOr<int64_t> sequence = client.Register();
  if (!sequence.ok()) {
    failed(sequence.status());
    return r;
  }
  std::vector<float> params(model.total_params), gradient(model.total_params, 1e-4f);
  while (absl::Now() < stop) {
    absl::Time start = absl::Now();
    absl::StatusOr<ShardedClient::Versions> versions = client.Pull(absl::MakeSpan(params));
    if (!versions.ok()) {
      failed(versions.status());
      continue;
    }
    absl::Time pulled = absl::Now();
    r.pull_latency.push_back(pulled - start);
    absl::StatusOr<ShardedClient::PushSummary> push = client.Push(gradient);
    if (!push.ok()) {
      failed(push.status());
      continue;
    }
    r.push_latency.push_back(absl::Now() - pulled);
    ++r.acknowledged;
    r.duplicates += push->duplicates;
  }
  return r;
}

// "p50 / p99 / max" in milliseconds.
std::string Percentiles(std::vector<absl::Duration> d) {
  if (d.empty()) return "-";
  std::sort(d.begin(), d.end());
  auto ms = [&](double q) {
    return absl::ToDoubleMilliseconds(d[std::min(d.size() - 1, static_cast<size_t>(q * d.size()))]);
  };
  return absl::StrFormat("%.1f / %.1f / %.1f", ms(0.50), ms(0.99), ms(1.0));
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Concurrent clients pushing and pulling against an async cluster.\n"
      "Example: load_bench --clients=64 --seconds=60");
  absl::ParseCommandLine(argc, argv);
  const int clients = absl::GetFlag(FLAGS_clients);
  const int64_t n = absl::GetFlag(FLAGS_params);
  if (clients < 1 || n < 1) return Fail("--clients and --params must be positive");

  const std::string credentials = absl::GetFlag(FLAGS_credentials);
  if (credentials != "none" && credentials != "token" && credentials != "worker") {
    return Fail("--credentials must be none, token or worker");
  }
  if (credentials != "none" && !absl::GetFlag(FLAGS_ps).empty()) {
    return Fail("--credentials is for the shards started here (give --ps's clients PS_TOKEN)");
  }
  const std::string job_token = "load-bench-job-token-0123456789abcdef";
  // Client i's options: the token --credentials gives it.
  auto options_of = [&](int worker_id) {
    ClientOptions options;
    if (credentials == "token") options.security.token = job_token;
    if (credentials == "worker") options.security.token = WorkerToken(job_token, worker_id);
    return options;
  };

  std::unique_ptr<LocalCluster> cluster;
  std::vector<std::string> addresses;
  if (absl::GetFlag(FLAGS_ps).empty()) {
    std::string pattern = "/tmp/load-bench-XXXXXX";
    const std::string dir = mkdtemp(pattern.data());
    ClusterSecurity security;
    if (credentials != "none") {
      std::ofstream(dir + "/token") << job_token << "\n";
      security.token_file = dir + "/token";
      security.worker_identity = credentials == "worker";
    }
    cluster = std::make_unique<LocalCluster>(ExecutableDir(), dir, security);
    std::vector<std::string> flags = {"--optimizer=momentum", "--lr=0.01"};
    for (const std::string& f : absl::GetFlag(FLAGS_ps_flags)) flags.push_back(f);
    if (absl::Status s = cluster->StartShards(absl::GetFlag(FLAGS_shards), absl::StrCat("flat:", n),
                                              clients, flags, absl::GetFlag(FLAGS_replicas));
        !s.ok()) {
      return Fail(std::string(s.message()));
    }
    for (int i = 0; i < absl::GetFlag(FLAGS_shards); ++i) {
      addresses.push_back(cluster->ShardAddress(i));
    }
  } else {
    absl::StatusOr<std::vector<std::string>> parsed = ParseShardAddresses(absl::GetFlag(FLAGS_ps));
    if (!parsed.ok()) return Fail(std::string(parsed.status().message()));
    addresses = *parsed;
  }
  // An external cluster must run ps --model=flat:N --num_workers >= --clients.
  const ModelIdentity model{absl::StrCat("flat:", n), n, static_cast<int>(addresses.size())};

  ShardedClient setup(addresses, model, /*worker_id=*/0, options_of(0));
  if (absl::StatusOr<int64_t> s = setup.Register(); !s.ok()) return Fail(s.status().ToString());
  if (absl::StatusOr<int> s = setup.Initialize(std::vector<float>(n, 0.5f)); !s.ok()) {
    return Fail(s.status().ToString());
  }
  absl::StatusOr<std::vector<v1::StatsResponse>> before = setup.Stats();
  if (!before.ok()) return Fail(before.status().ToString());
  if (before->front().consistency() != "async") {
    return Fail("the cluster runs " + before->front().consistency() + ", not async");
  }
  std::vector<double> rss_start;
  if (cluster) {
    for (Subprocess& p : cluster->shards()) rss_start.push_back(ProcStatusMiB(p.pid(), "VmRSS"));
  }

  const absl::Duration duration = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  std::cout << "load_bench: " << clients << " clients, " << addresses.size() << " shards, " << n
            << " parameters, " << duration << ", credentials " << credentials << std::endl;
  const absl::Time start = absl::Now();
  std::vector<ClientResult> results(clients);
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back(
        [&, i] { results[i] = RunClient(addresses, model, i, options_of(i), start + duration); });
  }
  for (std::thread& t : threads) t.join();
  const absl::Duration elapsed = absl::Now() - start;

  absl::StatusOr<std::vector<v1::StatsResponse>> after = setup.Stats();
  if (!after.ok()) return Fail(after.status().ToString());
  ClientResult all;
  for (ClientResult& r : results) {
    all.push_latency.insert(all.push_latency.end(), r.push_latency.begin(), r.push_latency.end());
    all.pull_latency.insert(all.pull_latency.end(), r.pull_latency.begin(), r.pull_latency.end());
    all.acknowledged += r.acknowledged;
    all.duplicates += r.duplicates;
    all.errors += r.errors;
    if (all.first_error.empty()) all.first_error = r.first_error;
  }
  bool counts_match = true;
  std::vector<std::string> applied;
  for (size_t s = 0; s < after->size(); ++s) {
    int64_t delta = (*after)[s].pushes_applied() - (*before)[s].pushes_applied();
    counts_match = counts_match && delta == all.acknowledged;
    applied.push_back(absl::StrCat(delta));
  }

  auto row = [](const std::string& what, const std::string& value) {
    std::cout << absl::StrFormat("| %-38s | %-24s |\n", what, value);
  };
  row("metric", "value");
  row(std::string(38, '-'), std::string(24, '-'));
  row("clients, shards, parameters", absl::StrCat(clients, ", ", addresses.size(), ", ", n));
  row("duration (s)", absl::StrFormat("%.1f", absl::ToDoubleSeconds(elapsed)));
  row("errors (failed pulls and pushes)", absl::StrCat(all.errors));
  row("pushes acknowledged", absl::StrCat(all.acknowledged));
  row("pushes applied, per shard", absl::StrJoin(applied, ", "));
  row("acknowledged == applied", counts_match ? "yes" : "NO");
  row("retried pushes answered duplicate", absl::StrCat(all.duplicates));
  row("pushes/s", absl::StrFormat("%.1f", all.acknowledged / absl::ToDoubleSeconds(elapsed)));
  row("push latency p50 / p99 / max (ms)", Percentiles(all.push_latency));
  row("pull latency p50 / p99 / max (ms)", Percentiles(all.pull_latency));
  if (cluster) {
    for (size_t s = 0; s < cluster->shards().size(); ++s) {
      pid_t pid = cluster->shards()[s].pid();
      row(absl::StrCat("shard ", s, " RSS start / end / peak (MiB)"),
          absl::StrFormat("%.0f / %.0f / %.0f", rss_start[s], ProcStatusMiB(pid, "VmRSS"),
                          ProcStatusMiB(pid, "VmHWM")));
    }
  }
  if (all.errors > 0) std::cout << "first error: " << all.first_error << "\n";
  return all.errors == 0 && counts_match ? 0 : 1;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
