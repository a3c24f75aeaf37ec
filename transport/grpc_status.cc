#include "transport/grpc_status.h"

namespace ps {

// The two enums share gRPC's canonical code numbering.
grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

namespace {
constexpr char kShardRestarted[] = "ps.v1.shard-restarted";
constexpr char kSharedMemoryLost[] = "ps.v1.shared-memory-lost";
constexpr char kDataPlaneLost[] = "ps.v1.data-plane-lost";

bool IsPrecondition(const grpc::Status& s, const char* detail) {
  return s.error_code() == grpc::StatusCode::FAILED_PRECONDITION && s.error_details() == detail;
}
}  // namespace

grpc::Status ShardRestartedStatus(const std::string& message) {
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, message, kShardRestarted);
}

bool IsShardRestarted(const grpc::Status& s) { return IsPrecondition(s, kShardRestarted); }

grpc::Status SharedMemoryLostStatus(const std::string& message) {
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, message, kSharedMemoryLost);
}

bool IsSharedMemoryLost(const grpc::Status& s) { return IsPrecondition(s, kSharedMemoryLost); }

grpc::Status DataPlaneLostStatus(const std::string& message) {
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, message, kDataPlaneLost);
}

bool IsDataPlaneLost(const grpc::Status& s) { return IsPrecondition(s, kDataPlaneLost); }

}  // namespace ps
