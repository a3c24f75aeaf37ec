// A daemon's Prometheus endpoint: prometheus-cpp's Exposer serving GET /metrics on
// --metrics_host:--metrics_port (off by default; 0 picks a free port, logged), with a registry for
// the daemon's own counters, gauges and histograms and room for collectors that read their values
// at scrape time. Thread-safe (prometheus-cpp's metrics and registry are).
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

// The endpoint --metrics_port and --metrics_host ask for, logged; null when --metrics_port < 0. A
// host beyond loopback needs --metrics_insecure (plaintext HTTP to anyone who asks; kept apart from
// a daemon's --insecure, which lowers its service's own guard).
absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsFromFlags();

// Buckets for durations of calls and steps: 100 us to 30 s, about 2.5x apart.
std::vector<double> LatencyBuckets();

}  // namespace ps
