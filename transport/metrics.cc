#include "transport/metrics.h"

#include <dlfcn.h>
#include <prometheus/gauge.h>
#include <pthread.h>

#include <algorithm>
#include <exception>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/version.h"
#include "transport/security.h"

ABSL_FLAG(int, metrics_port, -1,
          "Serve Prometheus metrics (GET /metrics) on this port (0: any free one; -1: off).");
ABSL_FLAG(std::string, metrics_host, "127.0.0.1",
          "Address of the metrics endpoint (plaintext HTTP, no authentication: anything but "
          "loopback needs --metrics_insecure).");
ABSL_FLAG(bool, metrics_insecure, false,
          "Allow a non-loopback --metrics_host (anyone who reaches it reads the metrics; the "
          "daemon's own service keeps its checks).");

// civetweb (Debian's libcivetweb, under prometheus-cpp's Exposer) creates its threads with 100 KiB
// stacks, and glibc refuses a stack smaller than the process's static TLS: the workers' (OpenBLAS
// and cuBLAS, about 160 KiB together) is larger, so the endpoint could not start ("Cannot create
// threads"). This definition, exported from every executable (see common/CMakeLists.txt), takes
// the place of libc's for the whole process and raises any smaller request to 1 MiB (address
// space only; pages are touched as used).
extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using Libc = int (*)(pthread_attr_t*, size_t);
  static const Libc libc = reinterpret_cast<Libc>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return libc(attr, std::max<size_t>(size, size_t{1} << 20));
}

namespace ps {

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& host,
                                                                        int port) {
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  const std::string address = host.find(':') != std::string::npos
                                  ? absl::StrCat("[", host, "]:", port)
                                  : absl::StrCat(host, ":", port);
  try {
    endpoint->exposer_ = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  endpoint->registry_ = std::make_shared<prometheus::Registry>();
  const BuildInfo& build = Build();
  prometheus::BuildGauge()
      .Name("ps_build_info")
      .Help("The daemon's build (as its --version): always 1")
      .Register(*endpoint->registry_)
      .Add({{"version", build.version},
            {"commit", build.commit},
            {"build_type", build.build_type},
            {"cuda", build.cuda ? "on" : "off"}})
      .Set(1);
  endpoint->exposer_->RegisterCollectable(endpoint->registry_);
  std::vector<int> ports = endpoint->exposer_->GetListeningPorts();
  endpoint->port_ = ports.empty() ? port : ports.front();
  return endpoint;
}

void MetricsEndpoint::Add(std::shared_ptr<prometheus::Collectable> collectable) {
  exposer_->RegisterCollectable(collectable);
  collectables_.push_back(std::move(collectable));
}

MetricsOptions MetricsOptionsFromFlags() {
  return {absl::GetFlag(FLAGS_metrics_port), absl::GetFlag(FLAGS_metrics_host),
          absl::GetFlag(FLAGS_metrics_insecure)};
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetrics(const MetricsOptions& options) {
  if (options.port < 0) return nullptr;
  if (options.port > 65535) {
    return absl::InvalidArgumentError("--metrics_port must be at most 65535");
  }
  if (absl::Status s =
          CheckListenHost("--metrics_host", options.host, ServerSecurity{}, options.insecure);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start(options.host, options.port);
  if (endpoint.ok()) {
    PS_LOG(INFO) << "Prometheus metrics on http://" << options.host << ":" << (*endpoint)->port()
                 << "/metrics";
  }
  return endpoint;
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsFromFlags() {
  return StartMetrics(MetricsOptionsFromFlags());
}

std::vector<double> LatencyBuckets() {
  return {1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2,
          0.1,  0.25,   0.5,  1,    2.5,    5,    10,   30};
}

}  // namespace ps
