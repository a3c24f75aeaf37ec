// The flags the client daemons (worker, evaluator) share, defined once: how they reach the shards
// (--tls_ca, --tls_cert, --tls_key, --token_file or PS_TOKEN) and their own health service
// (--health_host, --health_port, --insecure).
#pragma once

#include <grpcpp/server.h>

#include <memory>

#include "absl/status/statusor.h"
#include "common/security.h"

namespace ps {

// The shards' credentials from the flags, after checking that the health service may listen
// where asked. Fails with a one-line reason (an unreadable file, a non-loopback --health_host
// without --insecure, ...).
absl::StatusOr<ClientSecurity> ClientSecurityFromFlags();

// Starts grpc.health.v1 on --health_host:--health_port and logs the port; null when
// --health_port < 0.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartHealthFromFlags();

}  // namespace ps
