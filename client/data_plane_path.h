// Tensors over the shard's data plane (transport/data_connection.h): a TCP connection of this
// client's own (one or more lanes), opened with a ticket from the shard (AttachDataPlane). A push
// or a pull is a call on the connection itself, answer included (no gRPC call), its tensor
// striped over the lanes when large; a push part sent as a backward pass fills it goes so too,
// its values last piece first as they become final, where the shard takes that (a tensor in one
// part). Compressed pushes are not taken (a fraction of the bytes: gRPC carries them). A
// connection that fails loses the path; its session asks for another. Thread-safe.
#pragma once

#include <memory>

#include "client/tensor_path.h"
#include "transport/data_connection.h"

namespace ps {

class DataPlanePath : public TensorPath {
 public:
  DataPlanePath(std::shared_ptr<DataConnection> connection, int replica)
      : connection_(std::move(connection)), replica_(replica) {}

  absl::string_view name() const override { return "the data plane"; }
  AttemptEnd Push(const PushPart& part, const PathCall& call, PushDone* done) override;
  AttemptEnd Pull(PullPart& part, const PathCall& call, v1::PullChunk* answer) override;
  bool SendsAsFilled(int64_t values) const override;

  // The replica of the shard the connection is with.
  int replica() const { return replica_; }
  DataConnection& connection() const { return *connection_; }

 private:
  // What a call on the connection that failed (`why`, not the shard's answer) ends in: a
  // deadline on a connection still open is the shard being slow (retried as any deadline); else
  // the path is lost.
  AttemptEnd CallFailed(const absl::Status& why) const;

  const std::shared_ptr<DataConnection> connection_;
  const int replica_;
};

}  // namespace ps
