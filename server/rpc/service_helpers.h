// What ShardService's sources share (server/rpc/shard_service.cc, grpc_pull.cc, plane_calls.cc):
// request parsing and checks, and the shard's read for a pull. Included by them only.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/ps.pb.h"
#include "server/rpc/shard_service.h"

namespace ps {

static_assert(static_cast<int>(WireType::kFloat32) == v1::FLOAT32 &&
                  static_cast<int>(WireType::kBFloat16) == v1::BFLOAT16 &&
                  static_cast<int>(WireType::kFloat16) == v1::FLOAT16 &&
                  static_cast<int>(Compressor::kOneBit) == v1::ONEBIT &&
                  static_cast<int>(Compressor::kTopK) == v1::TOPK &&
                  static_cast<int>(Compressor::kInt8) == v1::INT8,
              "WireType and Compressor numbers are ps.v1.DType's");

inline ModelIdentity FromProto(const v1::ModelIdentity& m) {
  return ModelIdentity{m.fingerprint(), m.total_params(), m.num_shards()};
}

inline grpc::Status InvalidArgument(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

inline absl::Status CheckDType(v1::DType dtype) {
  if (dtype != v1::FLOAT32) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported dtype ", v1::DType_Name(dtype), ": this server takes FLOAT32"));
  }
  return absl::OkStatus();
}

// Parses a raw request; INVALID_ARGUMENT naming the method if the bytes are not one.
template <typename Message>
inline grpc::Status Parse(const grpc::ByteBuffer& bytes, const char* method, Message* message) {
  grpc::Slice flat;
  if (!bytes.TrySingleSlice(&flat).ok() && !bytes.DumpToSingleSlice(&flat).ok()) {
    return InvalidArgument(absl::StrCat("cannot parse ", method, " request"));
  }
  if (!message->ParseFromArray(flat.begin(), static_cast<int>(flat.size()))) {
    return InvalidArgument(absl::StrCat("cannot parse ", method, " request"));
  }
  return grpc::Status::OK;
}

template <typename Message>
inline grpc::ByteBuffer Serialize(const Message& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

// Observers (negative ids) only read. A worker id touches the membership (Register joins it, a
// Pull refreshes the worker's lease), so it needs write access.
inline Access AccessFor(int worker_id) { return worker_id < 0 ? Access::kRead : Access::kWrite; }

// How long a call may wait for the shard: a minute at most, and it answers a little before the
// client's deadline so that the client learns why (e.g. ABORTED: held back, pull again) instead
// of timing out.
inline absl::Time AnswerBy(absl::Time client_deadline) {
  return std::min(absl::Now() + absl::Minutes(1), client_deadline - absl::Milliseconds(250));
}

// The shard's read for pull request `r`, waiting until `deadline` at most.
inline ParameterShard::ReadRequest ReadOf(const v1::PullRequest& r, absl::Time deadline) {
  return {FromProto(r.model()),
          r.worker_id(),
          r.offset(),
          r.length(),
          r.has_after_sequence() ? r.after_sequence() : -1,
          deadline,
          /*copy_out=*/nullptr};
}


}  // namespace ps
