#include "client/data_plane_path.h"

#include "client/grpc_path.h"
#include "transport/data_frames.h"
#include "transport/grpc_status.h"

namespace ps {

bool DataPlanePath::SendsAsFilled(int64_t values) const {
  return !connection_->ended() && connection_->last_piece_first() &&
         StripeCount(values, WireType::kFloat32, connection_->lanes()) == 1;
}

AttemptEnd DataPlanePath::CallFailed(const absl::Status& why) const {
  if (why.code() == absl::StatusCode::kDeadlineExceeded && !connection_->ended()) {
    return AttemptEnd::Answered(why);
  }
  return AttemptEnd::PathLost(why);
}

AttemptEnd DataPlanePath::Push(const PushPart& part, const PathCall& call, PushDone* done) {
  if (part.compressed != nullptr || !connection_->calls()) return AttemptEnd::NotTaken();
  const int64_t n = static_cast<int64_t>(part.values.size());
  // A held push's part whose values are still coming goes as they come, the last piece first,
  // where the shard takes that; every other way waits for them first.
  const bool last_piece_first =
      part.filling != nullptr && part.type == WireType::kFloat32 && SendsAsFilled(n);
  if (part.filling != nullptr && !last_piece_first) {
    if (std::optional<AttemptEnd> end = AwaitFinal(part.filling, *call.context)) return *end;
  }
  v1::PushHeader header = part.header;
  header.mutable_path()->set_data_connection(connection_->id());
  header.mutable_path()->set_data_transfer(connection_->NextTransfer());
  header.mutable_path()->set_last_piece_first(last_piece_first);
  // A part sent as backward makes it takes what backward takes (up to kMaxStreamedValues, each
  // piece within the connection's stall of the last); its answer, an attempt's time after its
  // last piece went.
  const absl::Time attempt_end = absl::FromChrono(call.context->deadline());
  absl::StatusOr<DataConnection::Answered> made =
      last_piece_first
          ? connection_->PushCall(header.path().data_transfer(), header.SerializeAsString(),
                                  part.values, part.type, absl::Now() + kMaxStreamedValues,
                                  FrameKind::kPushCall, part.filling, ValuesOrder::kLastPieceFirst,
                                  attempt_end - absl::Now())
          : connection_->PushCall(header.path().data_transfer(), header.SerializeAsString(),
                                  part.values, part.type, attempt_end);
  // This client cut its own frame (the push was dropped midway): the connection is gone, but
  // nothing is wrong with the plane (the session replaces the connection).
  if (!made.ok() && last_piece_first && part.filling->stopped() &&
      part.filling->WaitFor(n, absl::InfinitePast()) < n) {
    return AttemptEnd::DroppedHere();
  }
  if (!made.ok()) return CallFailed(made.status());
  if (made->status.ok() && !done->response.ParseFromString(made->response)) {
    return AttemptEnd::Answered(
        absl::InternalError("the shard's answer to a push on the data plane does not parse"));
  }
  if (made->status.ok()) done->saturated = made->saturated;
  return AttemptEnd::FromShard(made->status);
}

AttemptEnd DataPlanePath::Pull(PullPart& part, const PathCall& call, v1::PullChunk* answer) {
  if (!connection_->calls()) return AttemptEnd::NotTaken();
  v1::PullRequest request = part.request;
  request.mutable_path()->set_data_connection(connection_->id());
  request.mutable_path()->set_data_transfer(connection_->NextTransfer());
  absl::StatusOr<DataConnection::Answered> made = connection_->PullCall(
      request.path().data_transfer(), request.SerializeAsString(), part.values, part.type,
      absl::FromChrono(call.context->deadline()), part.seen);
  if (!made.ok()) return CallFailed(made.status());
  AttemptEnd end = AttemptEnd::FromShard(made->status);
  if (!end.ok()) return end;
  if (!answer->ParseFromString(made->response) || answer->dtype() != request.dtype() ||
      answer->offset() != request.offset() ||
      answer->data_values() != static_cast<int64_t>(part.values.size())) {
    return AttemptEnd::Answered(absl::DataLossError(
        "the shard's answer to a pull on the data plane is not the values asked for"));
  }
  return end;
}

}  // namespace ps
