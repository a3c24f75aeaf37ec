// Conversions between absl::Status (used inside the code) and grpc::Status (at the RPC edge).
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace ps {

grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

}  // namespace ps
