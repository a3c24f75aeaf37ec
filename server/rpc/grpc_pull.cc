#include <grpcpp/support/byte_buffer.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/rpc/payload.h"
#include "server/rpc/service_helpers.h"
#include "transport/chunking.h"
#include "transport/grpc_status.h"
#include "transport/tensor_codec.h"

// A gRPC Pull's answer, streamed: ShardService::Pull and its PullWriter.
namespace ps {

// Streams one Pull's answer: waits (without a thread) for the shard to admit the pull, then
// writes its snapshot chunk by chunk. Deletes itself when gRPC is done with it.
class ShardService::PullWriter : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // `admission`: the pull's token and place (ShardService::Pull); the rest is admitted here, the
  // request's wire type checked between the caller's identity and the replica's role.
  PullWriter(ShardService* service, grpc::CallbackServerContext* context,
             const grpc::ByteBuffer& request, Admission admission)
      : service_(service), context_(context), admission_(std::move(admission)) {
    v1::PullRequest r;
    grpc::Status checked = Parse(request, "Pull", &r);
    if (checked.ok()) {
      checked = service_->Admit(context, CallNeeds("Pull", Access::kRead).ActsAs(r.worker_id()),
                                &admission_);
    }
    if (checked.ok() && r.dtype() != v1::DTYPE_UNSPECIFIED) {
      absl::StatusOr<WireType> type = WireTypeOfDType(r.dtype());
      checked = ToGrpcStatus(type.status());
      if (type.ok()) type_ = *type;
    }
    if (checked.ok()) {
      checked = service_->Admit(
          context,
          CallNeeds("Pull", Access::kRead).Serving().ShardIncarnation(r.shard_incarnation()),
          &admission_);
    }
    if (checked.ok() && r.compress() != v1::DTYPE_UNSPECIFIED) checked = CheckCompressed(r);
    if (checked.ok() && r.path().shm_segment() != 0) {
      // Looked up now to refuse at once, and again when the values are written: a pull waiting
      // at a barrier holds no segment.
      absl::Status found = service_->segments_.Find(r.path().shm_segment(), r.worker_id()).status();
      checked =
          found.ok() ? grpc::Status::OK : SharedMemoryLostStatus(std::string(found.message()));
      shm_segment_ = r.path().shm_segment();
      shm_ticket_ = r.path().shm_ticket();
      worker_id_ = r.worker_id();
    } else if (checked.ok() && r.path().data_connection() != 0) {
      checked = InvalidArgument(
          "a pull on the data plane is a call made on it (PullCall), not a gRPC Pull naming it");
    }
    if (!checked.ok()) {
      Finish(checked);
      return;
    }
    ParameterShard::ReadRequest read = ReadOf(r, AnswerBy(absl::FromChrono(context->deadline())));
    if (shm_segment_ != 0) {  // the values go straight into the segment
      read.copy_out = [this](absl::Span<const float> values) {
        shared_status_ = WriteShared(values);
        shared_values_ = static_cast<int64_t>(values.size());
      };
    }
    ticket_ = service_->shard_->StartRead(
        std::move(read),
        [this](absl::StatusOr<ParameterShard::Snapshot> s) { OnAnswer(std::move(s)); });
  }

 private:
  // OK for a compressed pull the shard can answer (PullRequest.compress), which it then is;
  // INVALID_ARGUMENT naming the problem otherwise.
  grpc::Status CheckCompressed(const v1::PullRequest& r) {
    auto invalid = [](const std::string& why) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "compressed pull: " + why);
    };
    const int c = r.compress();
    if (c != v1::ONEBIT && c != v1::TOPK && c != v1::INT8) {
      return invalid(absl::StrCat("compress is dtype ", c, ", not ONEBIT, TOPK or INT8"));
    }
    if (r.worker_id() < 0) return invalid("an observer pulls whole values (no view is kept)");
    if (r.path().shm_segment() != 0 || r.path().data_connection() != 0) {
      return invalid("it goes over gRPC, not shared memory or the data plane");
    }
    if (c == v1::TOPK && !(r.topk_fraction() > 0 && r.topk_fraction() <= 1)) {
      return invalid(absl::StrCat("topk_fraction ", r.topk_fraction(), " is not in (0, 1]"));
    }
    if (c == v1::TOPK && service_->shard_->range().size() >= (int64_t{1} << 32)) {
      return invalid("top-k needs a range of fewer than 2^32 values: use more shards");
    }
    compression_ = {static_cast<Compressor>(c), c == v1::TOPK ? r.topk_fraction() : 0};
    held_view_ = r.view();
    worker_id_ = r.worker_id();
    return grpc::Status::OK;
  }
  void OnAnswer(absl::StatusOr<ParameterShard::Snapshot> answer) {
    if (!answer.ok()) {
      Finish(ToGrpcStatus(answer.status()));
      return;
    }
    snapshot_ = std::make_shared<ParameterShard::Snapshot>(*std::move(answer));
    guard_.emplace(service_->watchdog_.Watch(context_));  // a reader that stops reading ends
    if (compression_.compressor != Compressor::kNone) {
      PullViews::Answer a = service_->pull_views_.Encode(
          worker_id_, held_view_, snapshot_->values.span(), type_, compression_);
      view_ = a.view;
      base_view_ = a.base;
      if (a.base != 0) {
        change_ = std::make_shared<CompressedTensor>(std::move(a.change));
        service_->compressed_pulls_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    WriteNext();
  }
  void WriteNext() {
    absl::Span<const float> values = snapshot_->values.span();
    const int64_t count = change_ != nullptr ? static_cast<int64_t>(change_->bytes.size())
                          : shm_segment_ != 0 ? shared_values_
                                              : values.size();
    if (next_ < 0 || (next_ > 0 && next_ >= count)) {
      service_->RecordPull(change_ != nullptr ? count : count * WireBytes(type_), start_);
      Finish(grpc::Status::OK);
      return;
    }
    v1::PullChunk head;  // all but the data
    head.set_version(snapshot_->version);
    head.set_view(view_);
    head.set_base_view(base_view_);
    if (change_ != nullptr) {  // the change, compressed, in pieces of whole units
      const int64_t unit = CompressedUnitBytes(change_->compressor);
      const int64_t n = std::max<int64_t>(1, kChunkBytes / unit) * unit;
      head.set_offset(snapshot_->offset);
      head.set_dtype(static_cast<v1::DType>(change_->compressor));
      head.set_topk_pairs(change_->pairs);
      message_ = EncodeWithTensor(head.SerializeAsString(), v1::PullChunk::kDataFieldNumber,
                                  std::string_view(change_->bytes).substr(next_, n), change_);
      next_ += std::max<int64_t>(n, 1);
      StartWrite(&message_);
      return;
    }
    int64_t n = std::min<int64_t>(kChunkBytes / WireBytes(type_), values.size() - next_);
    head.set_offset(snapshot_->offset + next_);
    head.set_dtype(static_cast<v1::DType>(type_));
    if (shm_segment_ != 0) {  // the values are in the segment already: say so
      if (!shared_status_.ok()) {
        Finish(shared_status_);
        return;
      }
      head.set_shm_values(shared_values_);
      grpc::Slice slice(head.SerializeAsString());
      message_ = grpc::ByteBuffer(&slice, 1);
      next_ = -1;  // done after this message
      StartWrite(&message_);
      return;
    }
    absl::Span<const float> piece = values.subspan(next_, n);
    if (type_ == WireType::kFloat32) {  // the snapshot itself goes out
      message_ = EncodeWithTensor(head.SerializeAsString(), v1::PullChunk::kDataFieldNumber,
                                  AsBytes(piece), snapshot_);
    } else {
      auto encoded = std::make_shared<std::string>();
      service_->NoteSaturated(EncodeValues(piece, type_, encoded.get()), type_);
      message_ = EncodeWithTensor(head.SerializeAsString(), v1::PullChunk::kDataFieldNumber,
                                  *encoded, encoded);
    }
    next_ += std::max<int64_t>(n, 1);
    StartWrite(&message_);
  }
  // Writes `values` into the segment's pull region, if it waits for this request (called by the
  // shard under its data lock: ReadRequest::copy_out).
  grpc::Status WriteShared(absl::Span<const float> values) {
    absl::StatusOr<int64_t> saturated =
        WriteSharedPull(service_->segments_, shm_segment_, worker_id_, shm_ticket_, values, type_);
    if (!saturated.ok()) {
      if (saturated.status().code() == absl::StatusCode::kInternal) {
        return ToGrpcStatus(saturated.status());
      }
      return SharedMemoryLostStatus(std::string(saturated.status().message()));
    }
    service_->NoteSaturated(*saturated, type_);
    service_->shm_pulls_.fetch_add(1, std::memory_order_relaxed);
    return grpc::Status::OK;
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away during Pull"));
      return;
    }
    guard_->Progress();
    WriteNext();
  }
  // The client went away or the call was cancelled: a pull still waiting ends now (its answer,
  // CANCELLED, finishes the call); one being written ends with its next write.
  void OnCancel() override { service_->shard_->CancelRead(ticket_); }
  void OnDone() override { delete this; }

  ShardService* service_;
  grpc::CallbackServerContext* context_;
  const absl::Time start_ = absl::Now();
  Admission admission_;
  int64_t ticket_ = 0;
  // Shared with the slices that reference it on the wire (transport/tensor_codec.h).
  std::shared_ptr<ParameterShard::Snapshot> snapshot_;
  std::optional<StreamWatchdog::Guard> guard_;
  int64_t next_ = 0;                    // index of the next value to write; -1: all written
  WireType type_ = WireType::kFloat32;  // what the values travel as
  // The segment the values go through (0: none), the request's ticket and its client.
  int64_t shm_segment_ = 0;
  uint64_t shm_ticket_ = 0;
  int worker_id_ = -1;
  // A compressed pull: how, the view the worker named, and the answer (change_: null when the
  // whole values go).
  Compression compression_;
  uint64_t held_view_ = 0, view_ = 0, base_view_ = 0;
  std::shared_ptr<const CompressedTensor> change_;
  grpc::Status shared_status_;  // of writing the values into it, and how many
  int64_t shared_values_ = 0;
  grpc::ByteBuffer message_;
};

grpc::ServerWriteReactor<grpc::ByteBuffer>* ShardService::Pull(grpc::CallbackServerContext* context,
                                                               const grpc::ByteBuffer* request) {
  // The token is checked before a place is taken, so that a worker's own token counts against
  // its cap; the request's worker id is checked against it once parsed (PullWriter).
  Admission admission;
  grpc::Status refused =
      Admit(context, CallNeeds("Pull", Access::kRead).Limit(&pulls_), &admission);
  if (!refused.ok()) {
    // A reactor that only finishes: the limit holds before any work is done.
    struct Refusal : grpc::ServerWriteReactor<grpc::ByteBuffer> {
      explicit Refusal(grpc::Status s) { Finish(s); }
      void OnDone() override { delete this; }
    };
    return new Refusal(refused);
  }
  return new PullWriter(this, context, *request, std::move(admission));
}

}  // namespace ps
