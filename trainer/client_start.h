// The one start-up of the client daemons (worker, evaluator): the shared flags (client_flags.h,
// plus --data_dir, --csv, --device and --threads defined here) read and checked, the log tagged,
// SIGTERM handled, the Prometheus endpoint started (transport/metrics.h: --metrics_port,
// --metrics_host), the compute backend made and the health service started.
#pragma once

#include <grpcpp/server.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "transport/metrics.h"
#include "common/network_spec.h"
#include "kernels/backend.h"
#include "client/client_flags.h"

namespace ps {

struct ClientStart {
  ClientConnection connection;           // --ps, --hidden, credentials, ...
  NetworkSpec network;                   // connection.model, which these daemons build
  std::string data_dir;                  // --data_dir
  std::string csv;                       // --csv; "" for none
  std::unique_ptr<Backend> backend;      // --device (a GPU by rank: see MakeBackend), --threads
  std::unique_ptr<grpc::Server> health;  // --health_port; null when off
  std::unique_ptr<MetricsEndpoint> metrics;  // --metrics_port; null when off
};

// `rank`: the worker's (-1: not a worker). Fails with a one-line reason (a bad flag, a model that
// is not a network for Fashion-MNIST (a tensor layout is trained by Python workers), an
// unreadable credential, another worker's own token, no usable --device, a health port taken).
// `needs_shards`: as ClientConnectionFromFlags.
// `checks_only` (--dry_run): returns once the flags and credentials checked out, with only
// `connection` set, having started nothing. `own`: as ClientConnectionFromFlags.
absl::StatusOr<ClientStart> StartClient(const std::string& log_tag, int rank, bool needs_shards,
                                        bool checks_only = false, const SettingTexts& own = {});

}  // namespace ps
