#include "server/replication/change_sink.h"

#include "common/log.h"
#include "server/replication/state_transfer.h"
#include "transport/grpc_status.h"

namespace ps {
namespace {

// A change made on the backup's data plane is answered once applied; a backup that takes longer
// is stuck (the stream ends, and pushes waiting for it fail at their own deadlines first).
constexpr absl::Duration kChangeTimeout = absl::Seconds(30);

}  // namespace

bool StreamChangeSink::Ship(v1::ReplicationMessage& message,
                            const std::shared_ptr<const ReplicationLog::Entry>& entry) {
  return WriteMessage(message, write_) && WriteValues(entry->change.values, epoch_, entry, write_);
}

bool PlaneChangeSink::Ship(v1::ReplicationMessage& message,
                           const std::shared_ptr<const ReplicationLog::Entry>& entry) {
  ready_->WaitForNotification();  // ends with the stream at the latest
  const ShardChange& c = entry->change;
  const bool staged = c.forward_tag != 0 && stages_->Name(c.forward_tag, attachment_);
  if (staged) message.mutable_change()->set_staged(static_cast<int64_t>(c.forward_tag));
  if (!staged && static_cast<int64_t>(c.values.size()) != entry->length) {
    PS_LOG(ERROR) << "shard " << shard_index_ << ": change " << c.index << " names stage "
                  << c.forward_tag << ", which the backup no longer holds; it joins again";
    return false;
  }
  const bool ok = Call(message, staged ? absl::Span<const float>() : c.values);
  if (staged) stages_->Used(c.forward_tag, ok);
  return ok;
}

bool PlaneChangeSink::Call(const v1::ReplicationMessage& change, absl::Span<const float> values) {
  absl::StatusOr<DataConnection::Answered> answered =
      plane_->PushCall(plane_->NextTransfer(), change.SerializeAsString(), values,
                       WireType::kFloat32, absl::Now() + kChangeTimeout, FrameKind::kChangeCall);
  const absl::Status status = answered.ok() ? FromGrpcStatus(answered->status) : answered.status();
  if (!status.ok()) {
    PS_LOG(WARNING) << "shard " << shard_index_ << ": the backup did not take change "
                    << change.change().index() << " on its data plane (" << status.message() << ")";
    return false;
  }
  log_->Acknowledge(attachment_, change.change().index());
  return true;
}

}  // namespace ps
