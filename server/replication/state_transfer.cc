#include "server/replication/state_transfer.h"

#include "common/version.h"
#include "transport/chunking.h"
#include "transport/tensor_codec.h"

namespace ps {
namespace {

v1::ChangeHeader::Kind ToProto(ShardChange::Kind kind) {
  switch (kind) {
    case ShardChange::Kind::kInitialize:
      return v1::ChangeHeader::INITIALIZE;
    case ShardChange::Kind::kTaken:
      return v1::ChangeHeader::TAKEN;
    case ShardChange::Kind::kUpdate:
      return v1::ChangeHeader::UPDATE;
    default:  // a round's contribution is not a change the shard passes on
      return v1::ChangeHeader::KIND_UNSPECIFIED;
  }
}

v1::ChangeHeader::Drop ToProto(ShardChange::Drop drop) {
  switch (drop) {
    case ShardChange::Drop::kLate:
      return v1::ChangeHeader::LATE;
    case ShardChange::Drop::kStale:
      return v1::ChangeHeader::STALE;
    case ShardChange::Drop::kNorm:
      return v1::ChangeHeader::NORM;
    default:
      return v1::ChangeHeader::DROP_UNSPECIFIED;
  }
}

ShardChange::Drop FromProto(v1::ChangeHeader::Drop drop) {
  switch (drop) {
    case v1::ChangeHeader::LATE:
      return ShardChange::Drop::kLate;
    case v1::ChangeHeader::STALE:
      return ShardChange::Drop::kStale;
    case v1::ChangeHeader::NORM:
      return ShardChange::Drop::kNorm;
    default:
      return ShardChange::Drop::kNone;
  }
}

absl::StatusOr<ShardChange::Kind> FromProto(v1::ChangeHeader::Kind kind) {
  switch (kind) {
    case v1::ChangeHeader::INITIALIZE:
      return ShardChange::Kind::kInitialize;
    case v1::ChangeHeader::UPDATE:
      return ShardChange::Kind::kUpdate;
    case v1::ChangeHeader::TAKEN:
      return ShardChange::Kind::kTaken;
    default:
      return absl::DataLossError("a change of unknown kind");
  }
}

}  // namespace

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
  StampRelease(&m);
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

v1::ChangeHeader HeaderOf(const ShardChange& change, int64_t length) {
  v1::ChangeHeader header;
  header.set_index(change.index);
  header.set_kind(ToProto(change.kind));
  header.set_drop(ToProto(change.drop));
  header.set_version(change.version);
  header.set_worker_id(change.worker_id);
  header.set_sequence(change.sequence);
  header.set_clock(change.clock);
  header.set_staleness(change.staleness);
  header.set_learning_rate(change.learning_rate);
  header.set_length(length);
  return header;
}

absl::StatusOr<ShardChange> ChangeOf(const v1::ChangeHeader& h, int64_t size) {
  absl::StatusOr<ShardChange::Kind> kind = FromProto(h.kind());
  if (!kind.ok()) return kind.status();
  if (h.length() < 0 || h.length() > size) {
    return absl::DataLossError("a change longer than the shard");
  }
  return ShardChange{h.index(),    *kind,     FromProto(h.drop()), h.version(),      h.worker_id(),
                     h.sequence(), h.clock(), h.staleness(),       h.learning_rate()};
}

}  // namespace ps
