// The flags the client daemons (worker, evaluator) share, defined once: how they reach the shards
// (--tls_ca, --tls_cert, --tls_key, --token_file or PS_TOKEN, --pull_dtype) and their own health
// service (--health_host, --health_port, --insecure).
#pragma once

#include <grpcpp/server.h>

#include <memory>

#include "absl/status/statusor.h"
#include "common/security.h"
#include "common/wire_type.h"

namespace ps {

// The shards' credentials from the flags, after checking that the health service may listen
// where asked. Fails with a one-line reason (an unreadable file, a non-loopback --health_host
// without --insecure, ...).
absl::StatusOr<ClientSecurity> ClientSecurityFromFlags();

// --pull_dtype: what pulled weights travel as.
absl::StatusOr<WireType> PullTypeFromFlags();

// Starts grpc.health.v1 on --health_host:--health_port and logs the port; null when
// --health_port < 0.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartHealthFromFlags();

}  // namespace ps
