// The gRPC service ps.v1.Replication over a Replica (server/replication/replica.h): checks that
// the caller holds the replication token (Access::kReplicate: a backup receives the model, makes
// the primary acknowledge pushes, and claims epochs that fence a primary or make a backup take
// over, so only the replica peer may call), then hands the call over. Status reads raw bytes, so
// that the token is checked before anything is parsed and a request that does not parse gets
// INVALID_ARGUMENT naming the method.
//
// Thread-safe (gRPC's threads call it at once); `replica` must outlive it.
#pragma once

#include <grpcpp/grpcpp.h>

#include "proto/ps.grpc.pb.h"
#include "server/replication/replica.h"
#include "transport/security.h"

namespace ps {

class ReplicationService final
    : public v1::Replication::WithRawCallbackMethod_Status<v1::Replication::Service> {
 public:
  ReplicationService(Replica* replica, TokenAuthenticator tokens);
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  // Replaces the generated handler of Replicate, writing raw bytes (Replica::ServeBackup).
  grpc::Status Replicate(grpc::ServerContext* context, Replica::BackupStream* stream);

 private:
  Replica* const replica_;
  const TokenAuthenticator tokens_;
};

}  // namespace ps
