// The flags every client of the shards shares (worker, evaluator, export_model), defined once:
// where the shards are and how to reach them (--ps, --tls_ca, --tls_cert, --tls_key, --token_file
// or PS_TOKEN, --pull_dtype, --retry_seconds, --shared_memory, --data_plane), the model (--model,
// --hidden) and the client's own health service (--health_host, --health_port, --insecure). They
// are an adapter: client_settings.h reads and checks them as the settings of the same names. The
// daemons' start-up: client_start.h.
#pragma once

#include <grpcpp/server.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client_settings.h"
#include "transport/security.h"

namespace ps {

// From the flags (ClientConnectionFromSettings, naming flags in its messages), with `own`: the
// texts of the daemon's own flags that are client settings (a worker's --rank, --push_dtype,
// ...); `needs_shards`: --ps must name at least one shard (else it may be empty).
absl::StatusOr<ClientConnection> ClientConnectionFromFlags(bool needs_shards, ClientKind kind,
                                                           const SettingTexts& own = {});

// The shards' credentials from the flags, after checking that the health service may listen
// where asked. Fails with a one-line reason (an unreadable file, a non-loopback --health_host
// without --insecure, ...).
absl::StatusOr<ClientSecurity> ClientSecurityFromFlags();

// Starts grpc.health.v1 on --health_host:--health_port and logs the port; null when
// --health_port < 0.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartHealthFromFlags();

}  // namespace ps
