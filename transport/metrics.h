// A daemon's Prometheus endpoint: prometheus-cpp's Exposer serving GET /metrics on
// --metrics_host:--metrics_port (off by default; 0 picks a free port, logged), with a registry for
// the daemon's own counters, gauges and histograms and room for collectors that read their values
// at scrape time. Every endpoint serves ps_build_info{version,commit,build_type,cuda} 1
// (common/version.h). Thread-safe (prometheus-cpp's metrics and registry are).
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ps {

class MetricsEndpoint {
 public:
  // Listens on host:port; fails with a one-line reason (port taken, bad address) instead of
  // throwing as prometheus-cpp does.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& host, int port);

  int port() const { return port_; }
  prometheus::Registry& registry() { return *registry_; }
  // Serves `collectable` too; the endpoint keeps it alive.
  void Add(std::shared_ptr<prometheus::Collectable> collectable);

 private:
  MetricsEndpoint() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  int port_ = 0;
};

// Where a daemon serves its metrics: --metrics_port, --metrics_host and --metrics_insecure.
struct MetricsOptions {
  int port = -1;  // -1: no endpoint; 0: any free port
  std::string host = "127.0.0.1";
  // Allow a host beyond loopback (plaintext HTTP to anyone who asks; kept apart from a daemon's
  // --insecure, which lowers its service's own guard).
  bool insecure = false;
};
MetricsOptions MetricsOptionsFromFlags();

// The endpoint `options` ask for, its port logged; null when options.port < 0. Fails with a
// one-line reason naming the flags for a port beyond 65535, a host beyond loopback without
// `insecure`, or a port that cannot be served.
absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetrics(const MetricsOptions& options);
// StartMetrics(MetricsOptionsFromFlags()).
absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsFromFlags();

// Buckets for durations of calls and steps: 100 us to 30 s, about 2.5x apart.
std::vector<double> LatencyBuckets();

}  // namespace ps
