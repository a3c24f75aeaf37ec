// The gRPC face of a ParameterShard: parses and validates requests, streams tensors in chunks, and
// translates results to gRPC statuses. Thread-safe (gRPC calls it from many threads).
#pragma once

#include "proto/ps.grpc.pb.h"
#include "server/parameter_shard.h"

namespace ps {

// The shard's statistics as the wire (and the --stats_json file) carries them.
v1::StatsResponse StatsToProto(const ShardStats& stats);

// The unary methods and Pull use gRPC's streamed variants (StreamedService), so that the service
// reads their request itself: the generated handlers answer a request that is missing or does not
// parse with INTERNAL and no message, before any service code runs; these answer INVALID_ARGUMENT
// "cannot parse <Method> request". (A chunk of Initialize or Push that does not parse ends the
// stream early, which the payload checks report.)
class ShardService final : public v1::ParameterServer::StreamedService {
 public:
  explicit ShardService(ParameterShard* shard) : shard_(shard) {}

  grpc::Status StreamedRegister(
      grpc::ServerContext* context,
      grpc::ServerUnaryStreamer<v1::RegisterRequest, v1::RegisterResponse>* stream) override;
  grpc::Status Initialize(grpc::ServerContext* context,
                          grpc::ServerReader<v1::InitializeChunk>* reader,
                          v1::InitializeResponse* response) override;
  grpc::Status Push(grpc::ServerContext* context, grpc::ServerReader<v1::PushChunk>* reader,
                    v1::PushResponse* response) override;
  grpc::Status StreamedPull(
      grpc::ServerContext* context,
      grpc::ServerSplitStreamer<v1::PullRequest, v1::PullChunk>* stream) override;
  grpc::Status StreamedHeartbeat(
      grpc::ServerContext* context,
      grpc::ServerUnaryStreamer<v1::HeartbeatRequest, v1::HeartbeatResponse>* stream) override;
  grpc::Status StreamedLeave(
      grpc::ServerContext* context,
      grpc::ServerUnaryStreamer<v1::LeaveRequest, v1::LeaveResponse>* stream) override;
  grpc::Status StreamedGetStats(
      grpc::ServerContext* context,
      grpc::ServerUnaryStreamer<v1::StatsRequest, v1::StatsResponse>* stream) override;

 private:
  // The methods proper, once their request parsed.
  grpc::Status HandleRegister(const v1::RegisterRequest* request, v1::RegisterResponse* response);
  grpc::Status HandlePull(grpc::ServerContext* context, const v1::PullRequest* request,
                          grpc::ServerSplitStreamer<v1::PullRequest, v1::PullChunk>* writer);
  grpc::Status HandleHeartbeat(const v1::HeartbeatRequest* request,
                               v1::HeartbeatResponse* response);
  grpc::Status HandleLeave(const v1::LeaveRequest* request, v1::LeaveResponse* response);
  grpc::Status HandleGetStats(v1::StatsResponse* response);

  ParameterShard* shard_;
  BufferPool push_buffers_;  // gradients being received
};

}  // namespace ps
