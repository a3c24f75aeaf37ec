// The standard gRPC health service (grpc.health.v1.Health) for daemons that serve nothing else
// (workers, the evaluator). Parameter servers enable it on their own server.
#pragma once

#include <grpcpp/server.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ps {

// Starts a health-only server on host:port (port 0 picks a free one; *bound_port gets it). It is
// plaintext and unauthenticated: callers decide whether `host` is acceptable (CheckListenHost).
absl::StatusOr<std::unique_ptr<grpc::Server>> StartHealthServer(const std::string& host, int port,
                                                                int* bound_port);

}  // namespace ps
