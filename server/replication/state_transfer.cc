#include "server/replication/state_transfer.h"

#include "transport/chunking.h"
#include "transport/tensor_codec.h"

namespace ps {

bool WriteMessage(const v1::ReplicationMessage& message,
                  absl::FunctionRef<bool(grpc::ByteBuffer)> write) {
  grpc::Slice slice(message.SerializeAsString());
  return write(grpc::ByteBuffer(&slice, 1));
}

bool WriteValues(absl::Span<const float> values, int64_t epoch,
                 const std::shared_ptr<const void>& owner,
                 absl::FunctionRef<bool(grpc::ByteBuffer)> write) {
  bool ok = true;
  v1::ReplicationMessage m;
  m.set_epoch(epoch);
  const std::string head = m.SerializeAsString();
  ForEachChunk(values, kChunkFloats, [&](int64_t, std::string_view bytes) {
    if (ok)
      ok = write(EncodeWithTensor(head, v1::ReplicationMessage::kDataFieldNumber, bytes, owner));
  });
  return ok;
}

bool WriteState(const ShardState& state, int64_t epoch, const std::shared_ptr<const void>& owner,
                absl::FunctionRef<bool(grpc::ByteBuffer)> write) {
  v1::ReplicationMessage m;
  m.set_epoch(epoch);
  *m.mutable_state() = state.header;
  bool ok = WriteMessage(m, write);
  for (int i = 0; ok && i < state.header.tensors_size(); ++i) {
    ok = WriteValues(state.tensors[i], epoch, owner, write);
  }
  return ok;
}

absl::Status ReadValues(NextMessage next, int64_t epoch, absl::Span<float> dst) {
  ChunkAssembler assembler(dst);
  v1::ReplicationMessage m;
  while (assembler.received() < static_cast<int64_t>(dst.size())) {
    if (!next(&m)) return absl::UnavailableError("the primary's stream ended");
    if (m.epoch() != epoch || m.has_state() || m.has_change() || m.data().empty()) {
      return absl::DataLossError("the primary's stream broke off a tensor");
    }
    if (absl::Status s = assembler.Append(m.data()); !s.ok()) return s;
  }
  return assembler.Finish();
}

absl::StatusOr<ShardState> ReadState(const v1::ReplicationMessage& first, int64_t size,
                                     NextMessage next) {
  if (!first.has_state()) return absl::DataLossError("the primary sent no state first");
  ShardState state;
  state.header = first.state();
  if (state.header.tensors_size() > kMaxStateTensors) {
    return absl::InvalidArgumentError("the primary's state names too many tensors");
  }
  for (int i = 0; i < state.header.tensors_size(); ++i) {
    state.tensors.emplace_back(size);
    if (absl::Status s = ReadValues(next, first.epoch(), absl::MakeSpan(state.tensors.back()));
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = CheckStateShape(state, size); !s.ok()) return s;
  return state;
}

}  // namespace ps
