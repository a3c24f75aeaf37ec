// Training across hosts over wide-area links: S shards and W workers on emulated hosts
// (tests/netns/virtual_hosts.h: network namespaces, --rate_gbit links, a one-way --latencies_ms
// delay each), async against sync at each latency, and each way of sending tensors of
// --push_dtypes (fp32 against compressed pushes and pulls: worker --compress, --pull_compress).
// Per run: time to --target test accuracy (the evaluator, on a host of its own, scores every
// second), steps/s and each step's pull / compute / push, updates/s and mean staleness per shard,
// and the bytes each shard's link carried per second against the ceiling measured on the same
// links in the same run (iperf3 from a worker's host to a shard's). With several --schedules,
// each step's communication scheduled each way (worker --overlap, --prefetch), and each one's step
// time against the first's. Every figure also goes to --json, which bench/scaling_model.py reads
// to set its predictions beside them. Needs root (namespaces), iptables and netdelay (latency).
//
// With several --push_dtypes, a second table gives each one's time to the first one's final
// accuracy minus --behind (the same seeds, steps and links) and its speed-up against the first.
//
//   sudo build/bin/wan_bench --latencies_ms=0,2,20 --modes=async,sync --json=wan.json
//   sudo build/bin/wan_bench --latencies_ms=0 --modes=async --rate_gbit=0.1
//       --hidden=1024,512 --push_dtypes=fp32,onebit,topk:0.01,int8,topk:0.01/bf16
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/iperf3.h"
#include "common/compression.h"
#include "common/wire_type.h"
#include "deploy/subprocess.h"
#include "nlohmann/json.hpp"
#include "tests/netns/virtual_hosts.h"

ABSL_FLAG(std::vector<std::string>, latencies_ms, std::vector<std::string>({"0", "2", "20"}),
          "One-way delays of every link to run at, in ms.");
ABSL_FLAG(std::vector<std::string>, modes, std::vector<std::string>({"async", "sync"}),
          "Consistency models to run at each latency.");
ABSL_FLAG(std::vector<std::string>, push_dtypes, std::vector<std::string>({"fp32"}),
          "How tensors travel, one run each: PUSH[/PULL], PUSH a worker --push_dtype (fp32, bf16, "
          "fp16) or --compress (onebit, topk:F, int8), PULL its --pull_dtype (default fp32) or "
          "--pull_compress (a compressor, as PUSH).");
ABSL_FLAG(std::vector<std::string>, schedules, std::vector<std::string>({"serial"}),
          "How each step's communication is scheduled, one run each: serial (pull, compute, "
          "push), overlap (worker --overlap: layer by layer during compute), prefetch (worker "
          "--prefetch: the next step's pull during this one's compute), overlap+prefetch. With "
          "several, a table gives each one's step time against the first's.");
ABSL_FLAG(int, repeats, 1,
          "Runs of every configuration, all of them in turn before the next round (so that a "
          "drift of the machine spreads over them); the schedules' table takes medians.");
ABSL_FLAG(bool, error_feedback, true, "The workers' --error_feedback with a compressor.");
ABSL_FLAG(bool, data_plane, true,
          "Workers and the evaluator move tensors over the shards' data plane (their "
          "--data_plane); false: over gRPC's streams, to measure the plane against them.");
ABSL_FLAG(double, behind, 0.01,
          "With several --push_dtypes: report each one's time to the first one's final accuracy "
          "minus this.");
ABSL_FLAG(double, eval_interval_seconds, 1,
          "Seconds between the evaluator's pulls (each moves the whole model over the shards' "
          "links: keep it long on slow ones).");
ABSL_FLAG(double, jitter, 0, "Jitter as a fraction of the delay (0.5: 2 ms +- 1 ms).");
ABSL_FLAG(double, loss, 0, "Fraction of packets each host drops on receipt.");
ABSL_FLAG(double, rate_gbit, 1, "Every host's link, Gbit/s.");
ABSL_FLAG(int, workers, 2, "Workers W, each on its own host.");
ABSL_FLAG(int, shards, 2, "Shards' hosts S.");
ABSL_FLAG(int, shards_per_host, 1,
          "Shards (ps processes) on each shard host, K: the job has S x K shards, listed host by "
          "host in turn (the cluster spec's shards_per_host: shard i on host i % S), so that the "
          "flat vector's consecutive parts alternate hosts.");
ABSL_FLAG(std::string, hidden, "128,64", "The MLP's hidden layers.");
ABSL_FLAG(int, batch_size, 64, "Each worker's minibatch.");
ABSL_FLAG(std::string, device, "cpu", "Where the workers compute (worker --device: cpu, cuda).");
ABSL_FLAG(double, lr, 0.01, "Learning rate (momentum 0.9).");
ABSL_FLAG(int64_t, steps, 800, "Steps per worker.");
ABSL_FLAG(double, target, 0.80, "Test accuracy whose first time is reported.");
ABSL_FLAG(std::string, json, "", "Write every run's figures here.");
ABSL_FLAG(std::string, run_dir, "/tmp/wan_bench", "Logs and CSVs of the runs.");

namespace ps {
namespace {

struct Run {
  double latency_ms;
  std::string mode;
  std::string schedule;  // an entry of --schedules
  std::string push;      // an entry of --push_dtypes
  int repeat = 0;        // of --repeats
};

// The worker section's keys for an entry of --schedules.
absl::StatusOr<std::string> ScheduleSettings(const std::string& entry) {
  if (entry == "serial") return R"("overlap": false, "prefetch": false)";
  if (entry == "overlap") return R"("overlap": true, "prefetch": false)";
  if (entry == "prefetch") return R"("overlap": false, "prefetch": true)";
  if (entry == "overlap+prefetch") return R"("overlap": true, "prefetch": true)";
  return absl::InvalidArgumentError("--schedules: unknown entry " + entry +
                                    " (serial, overlap, prefetch, overlap+prefetch)");
}

// The worker section's keys for an entry of --push_dtypes ("topk:0.01/bf16", "int8/int8"):
// "compress" or "push_dtype", and "pull_dtype" or "pull_compress".
absl::StatusOr<std::string> WireSettings(const std::string& entry) {
  std::vector<std::string> parts = absl::StrSplit(entry, '/');
  if (parts.size() > 2) return absl::InvalidArgumentError("more than one '/' in " + entry);
  const std::string pull = parts.size() == 2 ? parts[1] : "fp32";
  std::string settings = absl::StrCat(R"("pull_dtype": ")", pull, R"(")");
  if (!ParseWireType(pull).ok()) {
    absl::StatusOr<Compression> compression = ParseCompression(pull);
    if (!compression.ok()) return compression.status();
    settings = absl::StrCat(R"("pull_compress": ")", pull, R"(")");
  }
  if (ParseWireType(parts[0]).ok()) {
    return absl::StrCat(settings, R"(, "push_dtype": ")", parts[0], R"(")");
  }
  absl::StatusOr<Compression> compression = ParseCompression(parts[0]);
  if (!compression.ok()) return compression.status();
  return absl::StrCat(settings, R"(, "compress": ")", parts[0], R"(", "error_feedback": )",
                      absl::GetFlag(FLAGS_error_feedback) ? "true" : "false");
}

// A CSV's rows (header dropped), each split into numbers.
std::vector<std::vector<double>> ReadCsv(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::vector<double>> rows;
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::vector<double> row;
    for (absl::string_view field : absl::StrSplit(line, ',')) {
      double v = NAN;
      (void)absl::SimpleAtod(field, &v);
      row.push_back(v);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

double Mean(const std::vector<double>& v) {
  return v.empty() ? NAN : std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}
double StdDev(const std::vector<double>& v) {
  const double m = Mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return v.size() < 2 ? 0 : std::sqrt(s / (v.size() - 1));
}

int64_t NumParams(const std::string& hidden) {
  int64_t in = 784, n = 0;
  for (absl::string_view layer : absl::StrSplit(hidden, ',')) {
    int64_t out = 0;
    if (!absl::SimpleAtoi(layer, &out)) return -1;
    n += in * out + out;
    in = out;
  }
  return n + in * 10 + 10;
}

// The kernel's TCP congestion control, which new network namespaces inherit ("bbr" here: it paces
// a flow that sends in bursts at the rate it measured, see docs/scaling.md).
std::string TcpCongestionControl() {
  std::string name;
  std::ifstream("/proc/sys/net/ipv4/tcp_congestion_control") >> name;
  return name;
}

absl::StatusOr<nlohmann::json> RunJob(const Run& run, const std::string& dir) {
  const int S = absl::GetFlag(FLAGS_shards), W = absl::GetFlag(FLAGS_workers);
  const int shards_n = S * absl::GetFlag(FLAGS_shards_per_host);
  const LinkShape shape{.rate_gbit = absl::GetFlag(FLAGS_rate_gbit),
                        .delay_ms = run.latency_ms,
                        .jitter_ms = run.latency_ms * absl::GetFlag(FLAGS_jitter),
                        .loss = absl::GetFlag(FLAGS_loss)};
  absl::StatusOr<std::unique_ptr<VirtualHosts>> made =
      VirtualHosts::Create(S + W + 1, shape, ExecutableDir() + "/netdelay", dir);
  if (!made.ok()) return made.status();
  const VirtualHosts& hosts = **made;
  auto on = [&hosts](int host) {
    return [&hosts, host](std::vector<std::string> argv) { return hosts.On(host, argv); };
  };
  // The ceiling: one TCP stream from a worker's host to a shard's, on the same links.
  absl::StatusOr<double> tcp = Iperf3GBs(dir, 3, hosts.Address(0), 5201, on(0), on(S));
  if (!tcp.ok()) return tcp.status();

  const std::string hidden = absl::GetFlag(FLAGS_hidden);
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  std::string shards;
  for (int s = 0; s < S; ++s)
    absl::StrAppend(&shards, s ? ", " : "", "\"", hosts.Address(s), ":50051\"");
  std::ofstream(dir + "/token") << "wan-bench-token-0123456789abcdef\n";
  const std::string spec = dir + "/cluster.json";
  absl::StatusOr<std::string> wire = WireSettings(run.push);
  if (!wire.ok()) return absl::FailedPreconditionError(wire.status().message());
  absl::StatusOr<std::string> schedule = ScheduleSettings(run.schedule);
  if (!schedule.ok()) return absl::FailedPreconditionError(schedule.status().message());
  const char* plane = absl::GetFlag(FLAGS_data_plane) ? "true" : "false";
  std::ofstream(spec) << absl::StrFormat(
      R"({"hidden": "%s", "workers": %d, "shards": [%s], "shards_per_host": %d,
  "ps": {"optimizer": "momentum", "lr": %g, "consistency": "%s"},
  "worker": {"steps": %d, "batch_size": %d, "device": "%s", "shared_memory": false,
             "data_plane": %s, "retry_seconds": 120, "rpc_timeout_seconds": 60, %s, %s},
  "evaluator": {"interval_seconds": %g, "shared_memory": false, "data_plane": %s},
  "security": {"token_file": "%s/token"}})",
      hidden, W, shards, shards_n / S, absl::GetFlag(FLAGS_lr), run.mode, steps,
      absl::GetFlag(FLAGS_batch_size), absl::GetFlag(FLAGS_device), plane, *wire, *schedule,
      absl::GetFlag(FLAGS_eval_interval_seconds), plane, dir);
  std::vector<Subprocess> daemons;
  // Files are named by host, a shard's by its index.
  auto start = [&](int host, const std::string& program, const std::string& role,
                   const std::string& output_flag, int index) -> absl::Status {
    absl::StatusOr<Subprocess> p = Subprocess::Start(
        hosts.On(host, {ExecutableDir() + "/" + program, "--cluster=" + spec, "--role=" + role,
                        absl::StrCat(output_flag, dir, "/", program, "-", index, ".",
                                     program == "ps" ? "json" : "csv")}),
        absl::StrCat(dir, "/", program, "-", index, ".log"));
    if (!p.ok()) return p.status();
    daemons.push_back(*std::move(p));
    return absl::OkStatus();
  };
  for (int i = 0; i < shards_n; ++i) {
    if (absl::Status st = start(i % S, "ps", absl::StrCat("ps:", i), "--stats_json=", i);
        !st.ok()) {
      return st;
    }
  }
  std::vector<int64_t> received_before;
  for (int s = 0; s < S; ++s) received_before.push_back(hosts.ReceivedBytes(s));
  const double launched = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  for (int w = 0; w < W; ++w) {
    if (absl::Status st = start(S + w, "worker", absl::StrCat("worker:", w), "--csv=", S + w);
        !st.ok()) {
      return st;
    }
  }
  if (absl::Status st = start(S + W, "evaluator", "evaluator", "--csv=", S + W); !st.ok()) {
    return st;
  }
  for (int w = 0; w < W; ++w) {
    absl::StatusOr<int> code = daemons[shards_n + w].Wait(absl::Minutes(20));
    if (!code.ok() || *code != 0) {
      return absl::InternalError(absl::StrCat("worker ", w, " failed; see ", dir));
    }
  }
  std::vector<int64_t> received;
  for (int s = 0; s < S; ++s) received.push_back(hosts.ReceivedBytes(s) - received_before[s]);
  for (auto it = daemons.rbegin(); it != daemons.rend(); ++it) {
    if (it->Stop(absl::Seconds(30)) != 0) {
      return absl::InternalError(absl::StrCat(it->name(), " did not exit cleanly; see ", dir));
    }
  }

  // Worker CSVs:
  // step,wall_time,loss,base_version,staleness,epoch,dropped,pull_ms,compute_ms,push_ms The first
  // tenth of the steps is warm-up (connections, TCP windows), left out of the means.
  std::vector<double> step_ms, pull_ms, compute_ms, push_ms, compute_all;
  double last_wall = 0, start_wall = INFINITY;
  for (int w = 0; w < W; ++w) {
    std::vector<std::vector<double>> rows = ReadCsv(absl::StrCat(dir, "/worker-", S + w, ".csv"));
    if (rows.size() < 20) {
      return absl::InternalError(absl::StrCat("worker ", w, " wrote ", rows.size(),
                                              " steps; at least 20 are needed (--steps)"));
    }
    const size_t skip = rows.size() / 10;
    start_wall = std::min(start_wall, rows[0][1]);
    last_wall = std::max(last_wall, rows.back()[1]);
    step_ms.push_back(1000 * (rows.back()[1] - rows[skip][1]) / (rows.size() - 1 - skip));
    for (size_t i = skip; i < rows.size(); ++i) {
      pull_ms.push_back(rows[i][7]);
      compute_ms.push_back(rows[i][8]);
      push_ms.push_back(rows[i][9]);
    }
  }
  // Shards: updates (version) and the staleness histogram of the whole run.
  double versions = 0, staleness_sum = 0, staleness_n = 0;
  for (int i = 0; i < shards_n; ++i) {
    std::ifstream in(absl::StrCat(dir, "/ps-", i, ".json"));
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded()) return absl::InternalError(absl::StrCat("no statistics from shard ", i));
    versions += std::stod(j.value("version", std::string("0")));
    const nlohmann::json& counts = j["stalenessCounts"];
    for (size_t k = 0; k < counts.size(); ++k) {
      const double c = std::stod(counts[k].get<std::string>());
      staleness_sum += c * k;
      staleness_n += c;
    }
  }
  // Evaluator CSV: wall_time,version,test_loss,test_accuracy.
  double to_target = NAN, final_accuracy = NAN;
  nlohmann::json curve = nlohmann::json::array();  // [seconds since launch, test accuracy]
  for (const std::vector<double>& row : ReadCsv(absl::StrCat(dir, "/evaluator-", S + W, ".csv"))) {
    if (std::isnan(to_target) && row[3] >= absl::GetFlag(FLAGS_target))
      to_target = row[0] - launched;
    final_accuracy = row[3];
    curve.push_back({row[0] - launched, row[3]});
  }
  const double total_s = last_wall - launched;
  int64_t bytes = 0;
  for (int64_t b : received) bytes += b;
  return nlohmann::json{
      {"latency_ms", run.latency_ms},
      {"jitter_ms", shape.jitter_ms},
      {"loss", shape.loss},
      {"mode", run.mode},
      {"schedule", run.schedule},
      {"push", run.push},
      {"repeat", run.repeat},
      {"workers", W},
      {"shards", S},
      {"shards_per_host", shards_n / S},
      {"params", NumParams(hidden)},
      {"batch_size", absl::GetFlag(FLAGS_batch_size)},
      {"rate_gbit", shape.rate_gbit},
      {"tcp_gbs", *tcp},
      {"tcp_congestion_control", TcpCongestionControl()},
      {"steps", steps},
      {"step_ms", Mean(step_ms)},
      {"pull_ms", Mean(pull_ms)},
      {"compute_ms", Mean(compute_ms)},
      {"compute_sd_ms", StdDev(compute_ms)},
      {"push_ms", Mean(push_ms)},
      {"updates_per_s", versions / shards_n / (last_wall - start_wall)},
      {"staleness_mean", staleness_n > 0 ? staleness_sum / staleness_n : 0},
      {"shard_rx_gbs", bytes / S / (last_wall - start_wall) / 1e9},  // bytes of every step
      // What the shards received per worker step (a push to every shard, and pull requests).
      {"push_mb", static_cast<double>(bytes) / (W * steps) / 1e6},
      {"seconds", total_s},
      {"seconds_to_target",
       std::isnan(to_target) ? nlohmann::json(nullptr) : nlohmann::json(to_target)},
      {"target", absl::GetFlag(FLAGS_target)},
      {"final_accuracy", final_accuracy},
      {"accuracy_curve", curve}};
}

// The first time `run`'s evaluator saw at least `accuracy`; NaN if it never did.
double SecondsTo(const nlohmann::json& run, double accuracy) {
  for (const nlohmann::json& point : run["accuracy_curve"]) {
    if (point[1].get<double>() >= accuracy) return point[0].get<double>();
  }
  return NAN;
}

// Whether two runs differ only in the keys named.
bool SameBut(const nlohmann::json& a, const nlohmann::json& b,
             std::initializer_list<const char*> keys) {
  nlohmann::json x = a, y = b;
  for (const char* k : keys) x.erase(k), y.erase(k);
  for (const char* k : {"latency_ms", "mode", "schedule", "push", "repeat"}) {
    if (x.contains(k) && x[k] != y[k]) return false;
  }
  return true;
}

// For each latency, mode and schedule, every --push_dtypes entry's time to the first entry's
// final accuracy minus --behind, and its speed-up against the first's time to it.
void PrintTimesToBaseline(const nlohmann::json& runs) {
  std::cout << absl::StrFormat("\n%-8s %-6s %-16s %-16s | %-8s %-9s | %-12s %-8s\n", "delay",
                               "mode", "schedule", "push/pull", "final", "MB/push", "to baseline",
                               "speed-up");
  const nlohmann::json* baseline = nullptr;
  double target = NAN, baseline_s = NAN;
  for (const nlohmann::json& run : runs) {
    if (baseline == nullptr || !SameBut(*baseline, run, {"push"})) {
      baseline = &run;
      target = run["final_accuracy"].get<double>() - absl::GetFlag(FLAGS_behind);
      baseline_s = SecondsTo(run, target);
      std::cout << absl::StrFormat("(target: %s's final accuracy - %g = %.4f)\n",
                                   run["push"].get<std::string>(), absl::GetFlag(FLAGS_behind),
                                   target);
    }
    const double seconds = SecondsTo(run, target);
    std::cout << absl::StrFormat(
        "%-8s %-6s %-16s %-16s | %-8.4f %-9.3f | %-12s %-8s\n",
        absl::StrCat(run["latency_ms"].get<double>(), " ms"), run["mode"].get<std::string>(),
        run["schedule"].get<std::string>(), run["push"].get<std::string>(),
        run["final_accuracy"].get<double>(), run["push_mb"].get<double>(),
        std::isnan(seconds) ? "not reached" : absl::StrFormat("%.1f s", seconds),
        std::isnan(seconds) ? "-" : absl::StrFormat("%.2fx", baseline_s / seconds));
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty()      ? NAN
         : v.size() % 2 ? v[v.size() / 2]
                        : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// For each latency, mode and push, every --schedules entry's median step time (over --repeats)
// against the first entry's.
void PrintScheduleRatios(const nlohmann::json& runs) {
  std::cout << absl::StrFormat("\n%-8s %-6s %-16s %-16s | %-8s %-8s %-8s | %-13s | %s\n", "delay",
                               "mode", "push/pull", "schedule", "step ms", "pull ms", "push ms",
                               "step / first", "each run's step ms");
  auto median_of = [&](const nlohmann::json& like, const char* key, std::string* each) {
    std::vector<double> v;
    for (const nlohmann::json& r : runs) {
      if (SameBut(r, like, {"repeat"})) {
        v.push_back(r[key].get<double>());
        if (each != nullptr)
          absl::StrAppend(each, each->empty() ? "" : ", ", absl::StrFormat("%.4g", v.back()));
      }
    }
    return Median(v);
  };
  for (const nlohmann::json& run : runs) {
    if (run["repeat"].get<int>() != 0) continue;
    const nlohmann::json* first = nullptr;
    for (const nlohmann::json& r : runs) {
      if (SameBut(r, run, {"schedule"})) {
        first = &r;
        break;
      }
    }
    std::string each;
    const double step = median_of(run, "step_ms", &each);
    std::cout << absl::StrFormat(
        "%-8s %-6s %-16s %-16s | %-8.1f %-8.1f %-8.1f | %-13.2f | %s\n",
        absl::StrCat(run["latency_ms"].get<double>(), " ms"), run["mode"].get<std::string>(),
        run["push"].get<std::string>(), run["schedule"].get<std::string>(), step,
        median_of(run, "pull_ms", nullptr), median_of(run, "push_ms", nullptr),
        step / median_of(*first, "step_ms", nullptr), each);
  }
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Async vs sync training across emulated hosts at several link latencies (needs root).\n"
      "  sudo wan_bench --latencies_ms=0,2,20 --modes=async,sync --json=wan.json");
  absl::ParseCommandLine(argc, argv);
  std::vector<Run> runs;
  for (const std::string& l : absl::GetFlag(FLAGS_latencies_ms)) {
    double ms = 0;
    if (!absl::SimpleAtod(l, &ms) || ms < 0) {
      std::cerr << "wan_bench: bad --latencies_ms entry " << l << "\n";
      return 1;
    }
    for (const std::string& mode : absl::GetFlag(FLAGS_modes)) {
      for (const std::string& schedule : absl::GetFlag(FLAGS_schedules)) {
        for (const std::string& push : absl::GetFlag(FLAGS_push_dtypes)) {
          runs.push_back({ms, mode, schedule, push});
        }
      }
    }
  }
  const size_t configurations = runs.size();
  for (int r = 1; r < absl::GetFlag(FLAGS_repeats); ++r) {
    for (size_t i = 0; i < configurations; ++i) {
      runs.push_back(runs[i]);
      runs.back().repeat = r;
    }
  }
  const int64_t params = NumParams(absl::GetFlag(FLAGS_hidden));
  std::cout << absl::StrFormat(
      "MLP 784-%s-10 (%d parameters, %.2f MB per push), W = %d, S = %d x %d, %g Gbit/s "
      "links%s, batch %d, %d steps each, target %.3f\n",
      absl::GetFlag(FLAGS_hidden), params, params * 4e-6, absl::GetFlag(FLAGS_workers),
      absl::GetFlag(FLAGS_shards), absl::GetFlag(FLAGS_shards_per_host),
      absl::GetFlag(FLAGS_rate_gbit),
      absl::GetFlag(FLAGS_loss) > 0
          ? absl::StrFormat(", %g%% loss", absl::GetFlag(FLAGS_loss) * 100)
          : "",
      absl::GetFlag(FLAGS_batch_size), absl::GetFlag(FLAGS_steps), absl::GetFlag(FLAGS_target));
  std::cout << absl::StrFormat(
      "%-8s %-6s %-16s %-16s | %-7s %-8s %-7s %-8s %-7s | %-9s %-6s | %-8s %-8s %-5s | %-8s "
      "%-6s\n",
      "delay", "mode", "schedule", "push/pull", "step ms", "steps/s", "pull", "compute", "push",
      "updates/s", "stale", "shard rx", "iperf3", "ratio", "to target", "final");
  nlohmann::json all = nlohmann::json::array();
  int failures = 0;
  for (const Run& run : runs) {
    std::string dir = absl::StrCat(absl::GetFlag(FLAGS_run_dir), "/", run.mode, "-", run.latency_ms,
                                   "ms-", run.schedule, "-", run.push, "-", run.repeat);
    std::replace(dir.begin() + absl::GetFlag(FLAGS_run_dir).size() + 1, dir.end(), '/', '-');
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    absl::StatusOr<nlohmann::json> r = RunJob(run, dir);
    if (!r.ok()) {
      std::cout << absl::StrFormat("%-8s %-6s %-16s %-16s | failed: %s\n",
                                   absl::StrCat(run.latency_ms, " ms"), run.mode, run.schedule,
                                   run.push, r.status().message());
      if (r.status().code() == absl::StatusCode::kFailedPrecondition) return 1;
      ++failures;
      continue;
    }
    const nlohmann::json& j = *r;
    const double to_target =
        j["seconds_to_target"].is_null() ? NAN : j["seconds_to_target"].get<double>();
    std::cout << absl::StrFormat(
        "%-8s %-6s %-16s %-16s | %-7.1f %-8.1f %-7.1f %-8.1f %-7.1f | %-9.1f %-6.2f | %-8.3f "
        "%-8.3f %-5.2f | %-8s %-6.4f\n",
        absl::StrCat(run.latency_ms, " ms"), run.mode, run.schedule, run.push,
        j["step_ms"].get<double>(), 1000 / j["step_ms"].get<double>(), j["pull_ms"].get<double>(),
        j["compute_ms"].get<double>(), j["push_ms"].get<double>(), j["updates_per_s"].get<double>(),
        j["staleness_mean"].get<double>(), j["shard_rx_gbs"].get<double>(),
        j["tcp_gbs"].get<double>(), j["shard_rx_gbs"].get<double>() / j["tcp_gbs"].get<double>(),
        std::isnan(to_target) ? "-" : absl::StrFormat("%.1f s", to_target),
        j["final_accuracy"].get<double>());
    std::cout.flush();
    all.push_back(j);
  }
  if (absl::GetFlag(FLAGS_push_dtypes).size() > 1) PrintTimesToBaseline(all);
  if (absl::GetFlag(FLAGS_schedules).size() > 1 || absl::GetFlag(FLAGS_repeats) > 1) {
    PrintScheduleRatios(all);
  }
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream(path) << all.dump(2) << "\n";
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
