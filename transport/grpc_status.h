// Conversions between absl::Status (used inside the code) and grpc::Status (at the RPC edge), and
// the statuses clients must recognise beyond their code: "this shard restarted since you
// registered" and "send that tensor over gRPC" (shared memory, the data plane).
#pragma once

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace ps {

grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

// FAILED_PRECONDITION carrying the error detail "ps.v1.shard-restarted" (see
// RegisterResponse.shard_incarnation): the caller should register with the shard again.
grpc::Status ShardRestartedStatus(const std::string& message);
bool IsShardRestarted(const grpc::Status& s);

// FAILED_PRECONDITION carrying "ps.v1.shared-memory-lost": the shared-memory segment a request
// named is not (or no longer) usable; the caller should send the tensor over gRPC instead
// (transport/shared_memory.h).
grpc::Status SharedMemoryLostStatus(const std::string& message);
bool IsSharedMemoryLost(const grpc::Status& s);

// FAILED_PRECONDITION carrying "ps.v1.data-plane-lost": the data-plane connection a request named
// is not (or no longer) usable; the caller should send the tensor over gRPC instead
// (transport/data_plane.h).
grpc::Status DataPlaneLostStatus(const std::string& message);
bool IsDataPlaneLost(const grpc::Status& s);

}  // namespace ps
