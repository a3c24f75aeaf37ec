// Where a primary ships the changes after the state to its backup: the replication stream
// (StreamChangeSink), or a call on the backup's data plane each (PlaneChangeSink: no gRPC stream's
// copies and flow control on the way). The primary's loop ships each change without knowing
// which (server/replication/replica.h).
//
// Thread-compatible: one backup's stream ships its changes one at a time.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/synchronization/notification.h"
#include "proto/ps.pb.h"
#include "server/replication/replication_log.h"
#include "server/replication/stage_forwarder.h"
#include "transport/data_connection.h"

namespace ps {

class ChangeSink {
 public:
  virtual ~ChangeSink() = default;
  // Ships `entry`'s change, headed by `message` (its epoch and the change's header, which the
  // sink may complete). Returns false once this backup takes no more (the stream ends then).
  virtual bool Ship(v1::ReplicationMessage& message,
                    const std::shared_ptr<const ReplicationLog::Entry>& entry) = 0;
};

// The changes as messages on the replication stream, each followed by its values (which the
// backup acknowledges on the stream).
class StreamChangeSink final : public ChangeSink {
 public:
  using Write = std::function<bool(grpc::ByteBuffer)>;
  // `write` writes one message on the stream; `epoch` is the stream's.
  StreamChangeSink(Write write, int64_t epoch) : write_(std::move(write)), epoch_(epoch) {}
  bool Ship(v1::ReplicationMessage& message,
            const std::shared_ptr<const ReplicationLog::Entry>& entry) override;

 private:
  const Write write_;
  const int64_t epoch_;
};

// The changes as calls on the backup's data plane (ChangeCall: header, values, answered once
// applied, then acknowledged in `log` for `attachment`). A change whose forward tag names a
// stage the backup holds (`stages`) goes without its values.
class PlaneChangeSink final : public ChangeSink {
 public:
  // `log`, `stages` and `ready` must outlive this object; no change goes before `ready` (the
  // backup's state in place: a change would wait there, unread, while the state still comes).
  // `shard_index` is for messages.
  PlaneChangeSink(std::shared_ptr<DataConnection> plane, ReplicationLog* log,
                  StageForwarder* stages, int64_t attachment, absl::Notification* ready,
                  int shard_index)
      : plane_(std::move(plane)),
        log_(log),
        stages_(stages),
        attachment_(attachment),
        ready_(ready),
        shard_index_(shard_index) {}
  bool Ship(v1::ReplicationMessage& message,
            const std::shared_ptr<const ReplicationLog::Entry>& entry) override;

 private:
  // Makes `change` a call with `values`; acknowledged in the log once answered OK; false
  // (logged) if it was not.
  bool Call(const v1::ReplicationMessage& change, absl::Span<const float> values);

  const std::shared_ptr<DataConnection> plane_;
  ReplicationLog* const log_;
  StageForwarder* const stages_;
  const int64_t attachment_;
  absl::Notification* const ready_;
  const int shard_index_;
};

}  // namespace ps
