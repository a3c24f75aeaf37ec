// The standard gRPC health service (grpc.health.v1.Health) for daemons that serve nothing else
// (workers, the evaluator). Parameter servers enable it on their own server.
#pragma once

#include <grpcpp/server.h>

#include <memory>

#include "absl/status/statusor.h"

namespace ps {

// Starts a health-only server on 0.0.0.0:port (port 0 picks a free one; *bound_port gets it).
absl::StatusOr<std::unique_ptr<grpc::Server>> StartHealthServer(int port, int* bound_port);

}  // namespace ps
