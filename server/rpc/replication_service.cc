#include "server/rpc/replication_service.h"

#include <grpcpp/support/method_handler.h>

#include <utility>

#include "server/rpc/shard_service.h"
#include "transport/grpc_method.h"
#include "transport/grpc_status.h"

namespace ps {
namespace {

// Parses raw request bytes into `message`; false if they are not one.
bool ParseRaw(const grpc::ByteBuffer& bytes, google::protobuf::MessageLite* message) {
  grpc::Slice flat;
  if (!bytes.TrySingleSlice(&flat).ok() && !bytes.DumpToSingleSlice(&flat).ok()) return false;
  return message->ParseFromArray(flat.begin(), static_cast<int>(flat.size()));
}

}  // namespace

ReplicationService::ReplicationService(Replica* replica, TokenAuthenticator tokens)
    : replica_(replica), tokens_(std::move(tokens)) {
  MarkMethodStreamed(
      MethodIndex<v1::Replication>("Replicate"),
      new grpc::internal::BidiStreamingHandler<ReplicationService, v1::BackupMessage,
                                               grpc::ByteBuffer>(
          [](ReplicationService* s, grpc::ServerContext* context, Replica::BackupStream* stream) {
            return s->Replicate(context, stream);
          },
          this));
}

grpc::ServerUnaryReactor* ReplicationService::Status(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // The caller first: a stranger's bytes are never parsed.
  grpc::Status status = AuthorizeCall(tokens_, *context, Access::kReplicate, "Replication/Status");
  v1::ReplicaStatusRequest parsed;
  if (status.ok() && !ParseRaw(*request, &parsed)) {
    status =
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "cannot parse Replication/Status request");
  }
  if (status.ok()) {
    grpc::Slice slice(replica_->Status(parsed.take_over()).SerializeAsString());
    *response = grpc::ByteBuffer(&slice, 1);
  }
  reactor->Finish(status);
  return reactor;
}

grpc::Status ReplicationService::Replicate(grpc::ServerContext* context,
                                           Replica::BackupStream* stream) {
  if (grpc::Status s = AuthorizeCall(tokens_, *context, Access::kReplicate, "Replicate"); !s.ok()) {
    return s;
  }
  return ToGrpcStatus(replica_->ServeBackup(context, stream));
}

}  // namespace ps
