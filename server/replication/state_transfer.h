// How a shard's state and its changes travel on the replication stream (ps.v1.Replication in
// proto/ps.proto): a ReplicationMessage carrying a header (the ShardState's, or a change's), then
// the tensors' values as data messages of at most kChunkBytes each. The primary writes raw bytes
// that reference its own memory (transport/tensor_codec.h); the backup reads parsed messages.
// Functions only: thread-safe as far as their callbacks are.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/ps.pb.h"
#include "server/state/parameter_shard.h"
#include "server/state/shard_state.h"

namespace ps {

// Writes `message` (no data) through `write`; returns what write returned.
bool WriteMessage(const v1::ReplicationMessage& message,
                  absl::FunctionRef<bool(grpc::ByteBuffer)> write);
// Writes `values` as data messages of `epoch` that reference them; `owner` keeps them alive while
// gRPC holds them. Stops at the first write that fails; returns whether all went out.
bool WriteValues(absl::Span<const float> values, int64_t epoch,
                 const std::shared_ptr<const void>& owner,
                 absl::FunctionRef<bool(grpc::ByteBuffer)> write);
// Writes `state` as a stream starts: its header (with this release, common/version.h), then each
// tensor it names, in order (a state without a model is its header alone). `owner` keeps state's
// tensors alive (see WriteValues).
bool WriteState(const ShardState& state, int64_t epoch, const std::shared_ptr<const void>& owner,
                absl::FunctionRef<bool(grpc::ByteBuffer)> write);

// The next message of the stream into its argument; false once the stream ended.
using NextMessage = absl::FunctionRef<bool(v1::ReplicationMessage*)>;
// Reads the data messages of one tensor, of `epoch`, into `dst`: UNAVAILABLE if the stream ends
// first, DATA_LOSS if another message (or another epoch's) breaks it off or the sizes disagree.
absl::Status ReadValues(NextMessage next, int64_t epoch, absl::Span<float> dst);
// Reads the state a stream starts with, whose first message is `first`, for a shard of `size`
// values: DATA_LOSS if `first` carries no state; INVALID_ARGUMENT if it names more tensors than a
// state has (kMaxStateTensors) or one twice; ReadValues' errors.
absl::StatusOr<ShardState> ReadState(const v1::ReplicationMessage& first, int64_t size,
                                     NextMessage next);

// The header of `change`, whose values are `length` long (kept or not); a change's forward tag
// is not part of it (the primary names a stage its backup holds: ChangeHeader.staged).
v1::ChangeHeader HeaderOf(const ShardChange& change, int64_t length);
// The change `header` heads, its values still to come (values empty): DATA_LOSS for an unknown
// kind or more values than a shard of `size` holds.
absl::StatusOr<ShardChange> ChangeOf(const v1::ChangeHeader& header, int64_t size);

}  // namespace ps
