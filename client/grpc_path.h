// The path every shard offers: tensors in the gRPC calls themselves, as client streams of 1 MiB
// chunks on raw bytes (Push, Initialize: transport/tensor_codec.h) and the Pull server stream.
// One per replica of a shard: it owns the channel and stub the client's other calls to that
// replica use too. Thread-safe.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/sync_stream.h>

#include <functional>
#include <memory>
#include <string>

#include "client/tensor_path.h"
#include "proto/ps.grpc.pb.h"

namespace ps {

class GrpcPath : public TensorPath {
 public:
  explicit GrpcPath(std::shared_ptr<grpc::Channel> channel);

  absl::string_view name() const override { return "gRPC"; }
  AttemptEnd Push(const PushPart& part, const PathCall& call, PushDone* done) override;
  AttemptEnd Pull(PullPart& part, const PathCall& call, v1::PullChunk* answer) override;

  // Initial values for [header.offset, +length) (float32), as Initialize's client stream.
  grpc::Status Initialize(const v1::InitializeHeader& header, absl::Span<const float> values,
                          grpc::ClientContext* context, v1::InitializeResponse* response);
  // A push whose tensor travels in shared memory: `header` alone goes in the call; the shard's
  // answer.
  grpc::Status PushHeader(const v1::PushHeader& header, grpc::ClientContext* context,
                          v1::PushResponse* response);
  // A pull whose values travel elsewhere: the answer is one chunk naming them, which `head` gets
  // (DATA_LOSS if there are more, or values in it).
  grpc::Status PullHead(const v1::PullRequest& request, grpc::ClientContext* context,
                        v1::PullChunk* head);

  grpc::Channel& channel() const { return *channel_; }
  v1::ParameterServer::Stub* stub() const { return stub_.get(); }

 private:
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::ParameterServer::Stub> stub_;
  // Initialize and Push on raw bytes: tensors go out through transport/tensor_codec.h.
  const std::unique_ptr<grpc::internal::RpcMethod> initialize_, push_;
};

}  // namespace ps
