// The gRPC face of a ParameterShard: checks each caller's token, parses and validates requests,
// streams tensors in chunks, and translates results to gRPC statuses. Thread-safe (gRPC calls it
// from many threads).
#pragma once

#include "common/security.h"
#include "proto/ps.grpc.pb.h"
#include "server/parameter_shard.h"

namespace ps {

// The shard's statistics as the wire (and the --stats_json file) carries them.
v1::StatsResponse StatsToProto(const ShardStats& stats);

class ShardService final : public v1::ParameterServer::Service {
 public:
  // Every call is first checked against `tokens` (by default none: everyone may do everything).
  explicit ShardService(ParameterShard* shard, TokenAuthenticator tokens = {})
      : shard_(shard), tokens_(std::move(tokens)) {}

  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override;
  grpc::Status Initialize(grpc::ServerContext* context,
                          grpc::ServerReader<v1::InitializeChunk>* reader,
                          v1::InitializeResponse* response) override;
  grpc::Status Push(grpc::ServerContext* context, grpc::ServerReader<v1::PushChunk>* reader,
                    v1::PushResponse* response) override;
  grpc::Status Pull(grpc::ServerContext* context, const v1::PullRequest* request,
                    grpc::ServerWriter<v1::PullChunk>* writer) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status Leave(grpc::ServerContext* context, const v1::LeaveRequest* request,
                     v1::LeaveResponse* response) override;
  grpc::Status GetStats(grpc::ServerContext* context, const v1::StatsRequest* request,
                        v1::StatsResponse* response) override;

 private:
  // OK if the caller's token allows `call`; UNAUTHENTICATED or PERMISSION_DENIED otherwise.
  grpc::Status Authorize(const grpc::ServerContext& context, Access needed,
                         absl::string_view call) const;

  ParameterShard* shard_;
  const TokenAuthenticator tokens_;
  BufferPool push_buffers_;  // gradients being received
};

}  // namespace ps
