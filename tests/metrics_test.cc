// Prometheus metrics against real peers: every daemon's /metrics passes `promtool check metrics`,
// and a real Prometheus scraping a live job returns the job's update counter through its HTTP API.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/version.h"
#include "deploy/local_cluster.h"
#include "deploy/subprocess.h"
#include "nlohmann/json.hpp"
#include "tests/run_dir.h"

namespace ps {
namespace {

// Runs a shell command line to completion; its exit code and output.
std::pair<int, std::string> Shell(const std::string& command, const std::string& dir) {
  const std::string log =
      dir + "/shell-" + std::to_string(absl::ToUnixMicros(absl::Now())) + ".log";
  absl::StatusOr<Subprocess> p = Subprocess::Start({"/bin/bash", "-c", command}, log);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return {-1, ""};
  absl::StatusOr<int> code = p->Wait(absl::Seconds(30));
  return {code.ok() ? *code : -1, ReadFile(log)};
}

// The first sample's value of an instant query, or -1 while Prometheus has none.
double QueryValue(int prometheus_port, const std::string& query, const std::string& dir) {
  auto [code, out] = Shell(absl::StrCat("curl -sf 'http://127.0.0.1:", prometheus_port,
                                        "/api/v1/query?query=", query, "'"),
                           dir);
  if (code != 0) return -1;
  nlohmann::json j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || j.value("status", "") != "success") return -1;
  const nlohmann::json& result = j["data"]["result"];
  if (!result.is_array() || result.empty()) return -1;
  return std::stod(result[0]["value"][1].get<std::string>());
}

// The port a daemon logged for its metrics endpoint (--metrics_port=0 picks a free one: a port
// chosen in advance could be taken by then, as a client's ephemeral port); 0 if none in time.
int LoggedMetricsPort(const std::string& log) {
  const std::string marker = "Prometheus metrics on http://127.0.0.1:";
  for (absl::Time deadline = absl::Now() + absl::Seconds(30); absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(50))) {
    const std::string text = ReadFile(log);
    size_t at = text.find(marker);
    if (at != std::string::npos) return std::atoi(text.c_str() + at + marker.size());
  }
  return 0;
}

TEST(MetricsTest, PromtoolAcceptsEveryDaemonAndARealPrometheusScrapesTheJob) {
  const std::string dir = NewRunDir("metrics");
  absl::StatusOr<int> free_shard_port = FreePort(), free_prometheus_port = FreePort();
  ASSERT_TRUE(free_shard_port.ok() && free_prometheus_port.ok());
  const int shard_port = *free_shard_port, prometheus_port = *free_prometheus_port;
  const std::string shard = absl::StrCat("127.0.0.1:", shard_port);
  auto start = [&](std::vector<std::string> argv, const std::string& log) {
    absl::StatusOr<Subprocess> p = Subprocess::Start(argv, dir + "/" + log);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : Subprocess();
  };
  const std::string bin = ExecutableDir() + "/";
  Subprocess ps = start({bin + "ps", "--model=mlp:784-32-10", "--num_workers=1",
                         absl::StrCat("--port=", shard_port), "--metrics_port=0"},
                        "ps.log");
  Subprocess worker = start({bin + "worker", "--ps=" + shard, "--hidden=32", "--device=cpu",
                             "--max_seconds=120", "--metrics_port=0"},
                            "worker.log");
  Subprocess evaluator = start({bin + "evaluator", "--ps=" + shard, "--hidden=32",
                                "--interval_seconds=1", "--metrics_port=0"},
                               "evaluator.log");
  std::vector<int> metrics_ports;  // ps, worker, evaluator
  for (const char* log : {"ps.log", "worker.log", "evaluator.log"}) {
    metrics_ports.push_back(LoggedMetricsPort(dir + "/" + log));
    ASSERT_NE(metrics_ports.back(), 0) << ReadFile(dir + "/" + log);
  }
  ASSERT_TRUE(WaitForVersion(shard, 50, absl::Seconds(60))) << ReadFile(dir + "/worker.log");

  // promtool on each daemon's exposition, once it has something to say; each names its build.
  const BuildInfo& build = Build();
  const std::string build_info = absl::StrCat(
      "ps_build_info{build_type=\"", build.build_type, "\",commit=\"", build.commit, "\",cuda=\"",
      build.cuda ? "on" : "off", "\",version=\"", build.version, "\"} 1");
  for (int port : metrics_ports) {
    auto [code, out] = Shell(absl::StrCat("curl -sf http://127.0.0.1:", port,
                                          "/metrics | tee /dev/stderr | promtool check metrics"),
                             dir);
    EXPECT_EQ(code, 0) << "port " << port << ":\n" << out;
    EXPECT_NE(out.find(build_info), std::string::npos) << "port " << port << ":\n" << out;
  }
  auto [code, exposition] =
      Shell(absl::StrCat("curl -sf http://127.0.0.1:", metrics_ports[1], "/metrics"), dir);
  EXPECT_NE(exposition.find("worker_step_seconds_bucket{phase=\"compute\""), std::string::npos)
      << exposition;
  // Calls refused for want of a place, over gRPC and the data plane alike (none here).
  auto [ps_code, ps_exposition] =
      Shell(absl::StrCat("curl -sf http://127.0.0.1:", metrics_ports[0], "/metrics"), dir);
  EXPECT_NE(ps_exposition.find("ps_calls_refused_total{kind=\"pulls\",shard=\"0\"} 0"),
            std::string::npos)
      << ps_exposition;

  // A real Prometheus scraping the three every second.
  const std::string config = dir + "/prometheus.yml";
  std::ofstream(config) << absl::StrCat(
      "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: ps_job\n    static_configs:\n"
      "      - targets: ['127.0.0.1:",
      metrics_ports[0], "', '127.0.0.1:", metrics_ports[1], "', '127.0.0.1:", metrics_ports[2],
      "']\n");
  Subprocess prometheus = start(
      {"/usr/bin/prometheus", "--config.file=" + config, "--storage.tsdb.path=" + dir + "/tsdb",
       absl::StrCat("--web.listen-address=127.0.0.1:", prometheus_port)},
      "prometheus.log");
  double applied = -1, steps = -1, accuracy = -1;
  for (absl::Time deadline = absl::Now() + absl::Seconds(60);
       absl::Now() < deadline && (applied <= 0 || steps <= 0 || accuracy <= 0.1);) {
    // The evaluator's first score is of the untrained model (~0.1): wait for a trained one.
    absl::SleepFor(absl::Milliseconds(500));
    applied = QueryValue(prometheus_port, "ps_pushes_applied_total", dir);
    steps = QueryValue(prometheus_port, "worker_steps_total", dir);
    accuracy = QueryValue(prometheus_port, "evaluator_test_accuracy", dir);
  }
  EXPECT_GT(applied, 0) << ReadFile(dir + "/prometheus.log");
  EXPECT_GT(steps, 0);
  EXPECT_GT(accuracy, 0.1);  // above chance once the evaluator has scored some training
  // Once the worker stops, the counter Prometheus holds is exactly the shard's own.
  EXPECT_EQ(worker.Stop(absl::Seconds(10)), 0);
  const double final_applied = static_cast<double>(Stats(shard).pushes_applied());
  double scraped = -1;
  for (absl::Time deadline = absl::Now() + absl::Seconds(20);
       absl::Now() < deadline && scraped != final_applied;) {
    absl::SleepFor(absl::Milliseconds(500));
    scraped = QueryValue(prometheus_port, "ps_pushes_applied_total", dir);
  }
  EXPECT_EQ(scraped, final_applied);

  for (Subprocess* p : {&prometheus, &evaluator, &ps}) {
    EXPECT_EQ(p->Stop(absl::Seconds(10)), 0) << p->name();
  }
}

}  // namespace
}  // namespace ps
