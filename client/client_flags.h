// The flags every client of the shards shares (worker, evaluator, export_model), defined once:
// where the shards are and how to reach them (--ps, --tls_ca, --tls_cert, --tls_key, --token_file
// or PS_TOKEN, --pull_dtype, --retry_seconds, --shared_memory, --data_plane), the model (--hidden) and the
// client's own health service (--health_host, --health_port, --insecure). The daemons' start-up:
// client_start.h.
#pragma once

#include <grpcpp/server.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "transport/security.h"
#include "common/wire_type.h"
#include "client/sharded_client.h"

namespace ps {

// Where the shards are, the model they hold, and how to call them.
struct ClientConnection {
  std::vector<std::string> addresses;  // --ps, in shard order; empty when not needed
  std::string model;  // canonical spec (common/model_spec.h) of --model, else the --hidden MLP
  ModelIdentity identity;  // of `model`, with num_shards the number of addresses
  ClientOptions options;  // credentials, --pull_dtype, --retry_seconds, --shared_memory, --data_plane
};
// A daemon waits for shards that are down (a minute by default: they may be restarting); a
// one-shot tool reports them within seconds.
enum class ClientKind { kDaemon, kTool };
// From the flags; `needs_shards`: --ps must name at least one shard (else it may be empty).
absl::StatusOr<ClientConnection> ClientConnectionFromFlags(bool needs_shards, ClientKind kind);

// The shards' credentials from the flags, after checking that the health service may listen
// where asked. Fails with a one-line reason (an unreadable file, a non-loopback --health_host
// without --insecure, ...).
absl::StatusOr<ClientSecurity> ClientSecurityFromFlags();

// Starts grpc.health.v1 on --health_host:--health_port and logs the port; null when
// --health_port < 0.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartHealthFromFlags();

}  // namespace ps
