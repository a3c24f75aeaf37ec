#include "server/rpc/shard_service.h"

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/method_handler.h>
#include <unistd.h>

#include <optional>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "transport/chunking.h"
#include "transport/grpc_method.h"
#include "transport/grpc_status.h"
#include "common/log.h"
#include "transport/shared_memory.h"
#include "server/rpc/payload.h"

namespace ps {
namespace {

static_assert(static_cast<int>(WireType::kFloat32) == v1::FLOAT32 &&
                  static_cast<int>(WireType::kBFloat16) == v1::BFLOAT16 &&
                  static_cast<int>(WireType::kFloat16) == v1::FLOAT16 &&
                  static_cast<int>(Compressor::kOneBit) == v1::ONEBIT &&
                  static_cast<int>(Compressor::kTopK) == v1::TOPK &&
                  static_cast<int>(Compressor::kInt8) == v1::INT8,
              "WireType and Compressor numbers are ps.v1.DType's");

ModelIdentity FromProto(const v1::ModelIdentity& m) {
  return ModelIdentity{m.fingerprint(), m.total_params(), m.num_shards()};
}

grpc::Status InvalidArgument(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

absl::Status CheckDType(v1::DType dtype) {
  if (dtype != v1::FLOAT32) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported dtype ", v1::DType_Name(dtype), ": this server takes FLOAT32"));
  }
  return absl::OkStatus();
}

// Parses a raw request; INVALID_ARGUMENT naming the method if the bytes are not one.
template <typename Message>
grpc::Status Parse(const grpc::ByteBuffer& bytes, const char* method, Message* message) {
  grpc::Slice flat;
  if (!bytes.TrySingleSlice(&flat).ok() && !bytes.DumpToSingleSlice(&flat).ok()) {
    return InvalidArgument(absl::StrCat("cannot parse ", method, " request"));
  }
  if (!message->ParseFromArray(flat.begin(), static_cast<int>(flat.size()))) {
    return InvalidArgument(absl::StrCat("cannot parse ", method, " request"));
  }
  return grpc::Status::OK;
}

template <typename Message>
grpc::ByteBuffer Serialize(const Message& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

// Observers (negative ids) only read. A worker id touches the membership (Register joins it, a
// Pull refreshes the worker's lease), so it needs write access.
Access AccessFor(int worker_id) { return worker_id < 0 ? Access::kRead : Access::kWrite; }
}  // namespace

// The values of a pull going out on the data plane while the shard copies them (DataPlane::Send
// with a FillProgress), and the shard's answer: they come in either order, from either thread,
// and `done` runs once both did, with the values saturated, or why they did not go ("data plane
// lost": the client pulls over gRPC). The snapshot's buffer must stay alive until then.
class ShardService::PlaneSend {
 public:
  using Done = absl::AnyInvocable<void(grpc::Status lost, int64_t saturated)>;
  // The values must be out kLateGrace after `deadline`, the client's (DataPlane::Send): a pull
  // released at a barrier just before it still goes out (the client drops it) rather than
  // cutting the connection, and a client reading a trickle holds the lane that long at most.
  PlaneSend(DataPlane* plane, uint64_t connection, int owner, uint64_t transfer, WireType type,
            absl::Time deadline)
      : plane_(plane),
        connection_(connection),
        owner_(owner),
        transfer_(transfer),
        type_(type),
        deadline_(deadline + kLateGrace) {}
  static constexpr absl::Duration kLateGrace = absl::Seconds(30);
  // Queues `buffer` as the shard starts copying into it (under the values' lock: it only queues),
  // so that each piece goes out once copied. Returns what the copy tells of its progress; null if
  // the connection is gone. Runs on the thread that then calls Answered, as filling_ and lost_ are
  // written here and read there.
  FillProgress* Start(absl::Span<const float> buffer) {
    filling_ = std::make_shared<FillProgress>(static_cast<int64_t>(buffer.size()));
    absl::Status queued = plane_->Send(
        connection_, owner_, transfer_, filling_, buffer, type_,
        [this](absl::StatusOr<int64_t> sent) {
          {
            absl::MutexLock lock(&mu_);
            sent_ = std::move(sent);
          }
          Event();
        },
        deadline_, filling_.get());
    if (!queued.ok()) {
      lost_ = DataPlaneLostStatus(std::string(queued.message()));
      return nullptr;
    }
    return filling_.get();
  }
  // The shard answered with `values`, its snapshot's: sent now unless they went as copied; `done`
  // runs once they are sent (and may destroy this).
  void Answered(absl::Span<const float> values, Done done) {
    done_ = std::move(done);
    if (filling_ == nullptr && lost_.ok()) {
      if (FillProgress* progress = Start(values)) progress->Add(progress->total());
    }
    Event();
  }

 private:
  // Called once the shard answered and once the plane sent the values: the second runs `done`.
  void Event() {
    absl::StatusOr<int64_t> sent;
    {
      absl::MutexLock lock(&mu_);
      if (++events_ != (lost_.ok() ? 2 : 1)) return;
      sent = sent_;
    }
    Done done = std::move(done_);
    if (!lost_.ok()) {
      done(lost_, 0);
    } else if (!sent.ok()) {
      done(DataPlaneLostStatus(std::string(sent.status().message())), 0);
    } else {
      done(grpc::Status::OK, *sent);
    }
  }

  DataPlane* const plane_;
  const uint64_t connection_;
  const int owner_;
  const uint64_t transfer_;
  const WireType type_;
  const absl::Time deadline_;
  std::shared_ptr<FillProgress> filling_;  // null until the send starts
  grpc::Status lost_;                      // why it could not be queued
  Done done_;
  absl::Mutex mu_;
  int events_ ABSL_GUARDED_BY(mu_) = 0;
  absl::StatusOr<int64_t> sent_ ABSL_GUARDED_BY(mu_) = absl::UnknownError("unsent");
};

namespace {
// How long a call may wait for the shard: a minute at most, and it answers a little before the
// client's deadline so that the client learns why (e.g. ABORTED: held back, pull again) instead
// of timing out.
absl::Time AnswerBy(absl::Time client_deadline) {
  return std::min(absl::Now() + absl::Minutes(1), client_deadline - absl::Milliseconds(250));
}

// The shard's read for pull request `r`, waiting until `deadline` at most.
ParameterShard::ReadRequest ReadOf(const v1::PullRequest& r, absl::Time deadline) {
  return {FromProto(r.model()),
          r.worker_id(),
          r.offset(),
          r.length(),
          r.has_after_sequence() ? r.after_sequence() : -1,
          deadline,
          /*copy_out=*/nullptr};
}

// What heads the answer to a pull whose values went on the data plane.
v1::PullChunk PlanePullHead(const ParameterShard::Snapshot& snapshot, WireType type) {
  v1::PullChunk head;
  head.set_version(snapshot.version);
  head.set_offset(snapshot.offset);
  head.set_dtype(static_cast<v1::DType>(type));
  head.set_data_values(static_cast<int64_t>(snapshot.values.span().size()));
  return head;
}
}  // namespace

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
    if (checked.ok() && r.shm_segment() != 0) {
      // Looked up now to refuse at once, and again when the values are written: a pull waiting
      // at a barrier holds no segment.
      absl::Status found = service_->segments_.Find(r.shm_segment(), r.worker_id()).status();
      checked =
          found.ok() ? grpc::Status::OK : SharedMemoryLostStatus(std::string(found.message()));
      shm_segment_ = r.shm_segment();
      shm_ticket_ = r.shm_ticket();
      worker_id_ = r.worker_id();
    } else if (checked.ok() && r.data_connection() != 0) {
      if (service_->data_plane_ == nullptr) {
        checked = DataPlaneLostStatus("this shard has no data plane");
      }
      plane_.emplace(service_->data_plane_, r.data_connection(), r.worker_id(), r.data_transfer(),
                     type_, absl::FromChrono(context->deadline()));
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
    } else if (plane_.has_value()) {  // sent as they are copied
      read.filling = [this](absl::Span<const float> buffer) { return plane_->Start(buffer); };
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
    if (r.shm_segment() != 0 || r.data_connection() != 0) {
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
    if (!plane_.has_value()) {
      WriteNext();
      return;
    }
    plane_->Answered(snapshot_->values.span(), [this](grpc::Status lost, int64_t saturated) {
      if (!lost.ok()) {
        Finish(lost);
        return;
      }
      service_->NoteSaturated(saturated, type_);
      service_->data_plane_pulls_.fetch_add(1, std::memory_order_relaxed);
      message_ = Serialize(PlanePullHead(*snapshot_, type_));
      next_ = -1;  // done after this message
      StartWrite(&message_);
    });
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
  // The values' send on the data plane, if they go there.
  std::optional<PlaneSend> plane_;
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

ShardService::ShardService(ParameterShard* shard, const ShardProcess& process,
                           const ServiceLimits& limits, TokenAuthenticator tokens, Replica* replica,
                           ServiceMetrics metrics, Checkpointer* checkpointer,
                           DataPlane* data_plane)
    : shard_(shard),
      process_(process),
      tokens_(std::move(tokens)),
      replica_(replica),
      metrics_(metrics),
      checkpointer_(checkpointer),
      streams_("streams", limits.max_streams, limits.max_calls_per_worker),
      pulls_("pulls", limits.max_pulls, limits.max_calls_per_worker),
      watchdog_(limits.stream_idle, limits.stream_total),
      segments_(limits.shm_clients, shard->range().size() * static_cast<int64_t>(sizeof(float))),
      data_plane_(data_plane),
      pull_views_(shard->range().size(), limits.pull_views) {
  // Initialize and Push read raw bytes, so that tensors go from gRPC's slices straight into the
  // shard's buffers: their generated synchronous handlers are replaced by handlers of ByteBuffer
  // messages. The replacement API (meant for streamed methods) also marks them bidirectional,
  // which changes nothing for a synchronous server: neither kind reads a request before the
  // handler runs.
  ReadRawBytes("Initialize", &ShardService::Initialize);
  ReadRawBytes("Push", &ShardService::Push);
  if (data_plane_ != nullptr) {
    data_plane_->TakeCalls(
        {[this](const DataPlane::Call& call, DataPlane::ReadValues read_values) {
           return PushOnPlane(call, read_values);
         },
         [this](const DataPlane::Call& call, DataPlane::Answer answer) {
           PullOnPlane(call, std::move(answer));
         },
         // A backup's primary makes its changes there.
         [replica = replica_](const DataPlane::Call& call, DataPlane::ReadValues read_values) {
           if (replica != nullptr) return replica->OnPlaneChange(call, read_values);
           return DataPlane::CallAnswer{
               grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this shard is not replicated"),
               ""};
         },
         [this](uint64_t connection) { PlanePullEnded(connection); }});
  }
}

ShardService::~ShardService() {
  if (data_plane_ != nullptr) data_plane_->TakeCalls({});
}

template <typename Response>
void ShardService::ReadRawBytes(absl::string_view method, RawStream<Response> handle) {
  MarkMethodStreamed(
      MethodIndex<v1::ParameterServer>(method),
      new grpc::internal::ClientStreamingHandler<ShardService, grpc::ByteBuffer, Response>(
          [handle](ShardService* s, grpc::ServerContext* context,
                   grpc::ServerReader<grpc::ByteBuffer>* reader,
                   Response* response) { return (s->*handle)(context, reader, response); },
          this));
}

// An explicit check in each handler (Admit), not a grpc::AuthMetadataProcessor: gRPC 1.51 aborts
// when one is set on InsecureServerCredentials (so a token without TLS would be impossible), and
// it would guard the health service too, which stays open for probes.
grpc::Status AuthorizeCall(const TokenAuthenticator& tokens, const grpc::ServerContextBase& context,
                           Access access, absl::string_view call, Caller* caller) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthorizationMetadata);
  absl::string_view value;
  if (it != metadata.end()) value = absl::string_view(it->second.data(), it->second.size());
  absl::StatusOr<Caller> who = tokens.Authorize(value, access, call);
  if (who.ok() && caller != nullptr) *caller = *who;
  return ToGrpcStatus(who.status());
}

grpc::Status ShardService::Admit(grpc::ServerContextBase* context, const CallNeeds& needs,
                                 Admission* admission) {
  const Access access =
      needs.acts_as && needs.access == Access::kRead ? AccessFor(*needs.acts_as) : needs.access;
  // A token that allows writing allows reading: checked once unless the call needs more.
  const bool covered = admission->authorized_ == access ||
                       (admission->authorized_ == Access::kWrite && access == Access::kRead);
  if (!covered && context == nullptr) {  // a data-plane connection's token allows no more
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat(needs.call,
                                     " needs write access: this data-plane connection was asked "
                                     "for with reading rights only (as an observer, or with the "
                                     "read-only token)"));
  }
  if (!covered) {
    grpc::Status s = AuthorizeCall(tokens_, *context, access, needs.call, &admission->caller_);
    if (!s.ok()) return s;
    admission->authorized_ = access;
  }
  if (needs.acts_as) {
    absl::Status s = CheckActsAs(admission->caller_, *needs.acts_as, needs.call);
    if (!s.ok()) return ToGrpcStatus(s);
  }
  if (needs.serving && replica_ != nullptr) {
    absl::Status s = replica_->CheckServing(/*may_take_over=*/true);
    if (!s.ok()) return ToGrpcStatus(s);
  }
  if (needs.limit != nullptr) {
    absl::StatusOr<CallLimit::Slot> slot = needs.limit->TryAcquire(admission->caller_.worker);
    if (!slot.ok()) {
      if (metrics_.refused != nullptr) {
        metrics_.refused
            ->Add({{"shard", std::to_string(shard_->index())}, {"kind", needs.limit->what()}})
            .Increment();
      }
      return ToGrpcStatus(slot.status());
    }
    admission->slot_.emplace(*std::move(slot));
  }
  if (grpc::Status s = CheckShardIncarnation(needs.shard_incarnation); !s.ok()) return s;
  if (needs.watched && context != nullptr) admission->guard_.emplace(watchdog_.Watch(context));
  return grpc::Status::OK;
}

grpc::Status ShardService::CheckShardIncarnation(std::optional<int64_t> claimed) const {
  if (!claimed || *claimed == 0 || *claimed == process_.incarnation) return grpc::Status::OK;
  return ShardRestartedStatus(absl::StrCat(
      "shard ", shard_->index(), " restarted since this client registered (now incarnation ",
      process_.incarnation, ", registered with ", *claimed, "): register again"));
}

template <typename Request, typename Response, typename Claims, typename Handler>
grpc::ServerUnaryReactor* ShardService::Unary(grpc::CallbackServerContext* context,
                                              const grpc::ByteBuffer* in, grpc::ByteBuffer* out,
                                              const CallNeeds& needs, Claims claims,
                                              Handler handler) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Admission admission;
  Request request;
  Response response;
  grpc::Status status = Admit(context, needs, &admission);
  if (status.ok()) status = Parse(*in, needs.call, &request);
  if (status.ok()) {
    status = Admit(context, claims(request, CallNeeds(needs.call, needs.access)), &admission);
  }
  if (status.ok()) {
    if constexpr (std::is_invocable_v<Handler, const Request&, Response*, const Admission&>) {
      status = handler(request, &response, admission);
    } else {
      status = handler(request, &response);
    }
  }
  if (status.ok()) *out = Serialize(response);
  reactor->Finish(status);
  return reactor;
}

grpc::Status ShardService::WaitReplicated(const grpc::ServerContextBase& context) const {
  return WaitReplicated(absl::FromChrono(context.deadline()));
}

grpc::Status ShardService::WaitReplicated(absl::Time deadline) const {
  if (replica_ == nullptr) return grpc::Status::OK;
  return ToGrpcStatus(replica_->WaitReplicated(AnswerBy(deadline)));
}

grpc::ServerUnaryReactor* ShardService::Register(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) {
  return Unary<v1::RegisterRequest, v1::RegisterResponse>(
      context, request, response, CallNeeds("Register", Access::kRead),
      [](const auto& r, CallNeeds needs) { return needs.ActsAs(r.worker_id()).Serving(); },
      [&](const auto& request, auto* response) {
        if (absl::Status s = shard_->CheckNumWorkers(request.num_workers()); !s.ok()) {
          return ToGrpcStatus(s);
        }
        absl::StatusOr<Registration> r =
            shard_->Register(request.worker_id(), FromProto(request.model()),
                             request.has_resume_sequence() ? request.resume_sequence() : -1);
        if (!r.ok()) return ToGrpcStatus(r.status());
        response->set_shard_index(r->shard_index);
        response->set_initialized(r->initialized);
        response->set_begin(r->range.begin);
        response->set_end(r->range.end);
        response->set_version(r->version);
        response->set_last_sequence(r->last_sequence);
        response->set_consistency(r->consistency);
        response->set_incarnation(r->incarnation);
        response->set_shard_incarnation(process_.incarnation);
        return grpc::Status::OK;
      });
}

grpc::Status ShardService::Initialize(grpc::ServerContext* context,
                                      grpc::ServerReader<grpc::ByteBuffer>* reader,
                                      v1::InitializeResponse* response) {
  Admission admission;
  if (grpc::Status s = Admit(
          context, CallNeeds("Initialize", Access::kWrite).Serving().Limit(&streams_).Watched(),
          &admission);
      !s.ok()) {
    return s;
  }
  v1::InitializeChunk chunk;
  std::optional<TensorMessage> data;
  if (absl::Status s = ReadFirstChunk(reader, "Initialize", &chunk, &data); !s.ok()) {
    return ToGrpcStatus(s);
  }
  const v1::InitializeHeader& h = chunk.header();
  ModelIdentity model = FromProto(h.model());
  if (absl::Status s = CheckDType(h.dtype()); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<ParameterShard::InitializeSlot> slot =
      shard_->BeginInitialize(model, h.offset(), h.length());
  if (!slot.ok()) return ToGrpcStatus(slot.status());
  // Not needed by a shard already initialised (a restarted initialiser): the data is not read.
  if (slot->needed()) {
    StreamPayload<v1::InitializeChunk> source(reader, *std::move(data), &admission.guard());
    absl::Status read = source.ReadInto(slot->values(), PayloadFormat{}, IgnoreValues);
    if (!read.ok()) return ToGrpcStatus(read);
  }
  absl::StatusOr<bool> applied = shard_->Commit(*std::move(slot));
  if (!applied.ok()) return ToGrpcStatus(applied.status());
  response->set_applied(*applied);
  return WaitReplicated(*context);
}

grpc::Status ShardService::Push(grpc::ServerContext* context,
                                grpc::ServerReader<grpc::ByteBuffer>* reader,
                                v1::PushResponse* response) {
  const absl::Time start = absl::Now();
  Admission admission;
  if (grpc::Status s =
          Admit(context, CallNeeds("Push", Access::kWrite).Serving().Limit(&streams_).Watched(),
                &admission);
      !s.ok()) {
    return s;
  }
  v1::PushChunk chunk;
  std::optional<TensorMessage> data;
  if (absl::Status s = ReadFirstChunk(reader, "Push", &chunk, &data); !s.ok()) {
    shard_->RecordRejectedPush();
    return ToGrpcStatus(s);
  }
  const v1::PushHeader& h = chunk.header();
  if (h.last_piece_first()) {
    shard_->RecordRejectedPush();
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a push sent last piece first is made on the data plane itself");
  }
  // A push made as another worker counts as rejected; one for an earlier process of this shard
  // does not (the client registers again and sends it anew).
  if (grpc::Status s = Admit(context,
                             CallNeeds("Push", Access::kWrite)
                                 .ActsAs(h.worker_id())
                                 .ShardIncarnation(h.shard_incarnation()),
                             &admission);
      !s.ok()) {
    if (!IsShardRestarted(s)) shard_->RecordRejectedPush();
    return s;
  }
  std::unique_ptr<PayloadSource> source;
  if (grpc::Status s = OpenPushPayload(context, reader, h, std::move(data), &admission, &source);
      !s.ok()) {
    return s;
  }
  if (grpc::Status s = ApplyPush(h, std::move(source), start, response); !s.ok()) return s;
  // A duplicate too: its first delivery may still be on its way to the backup.
  return WaitReplicated(*context);
}

grpc::Status ShardService::ApplyPush(const v1::PushHeader& h, std::unique_ptr<PayloadSource> source,
                                     absl::Time start, v1::PushResponse* response) {
  // begin -> read -> commit: the header is checked once, the payload goes into the slot's
  // buffer, and a slot not committed counts as a rejected push.
  absl::StatusOr<ParameterShard::PushSlot> slot = shard_->BeginPush(
      {h.worker_id(), h.sequence(), h.base_version(), h.offset(), h.length(), h.incarnation()});
  if (!slot.ok()) return ToGrpcStatus(slot.status());
  absl::StatusOr<PayloadFormat> format = PushPayloadFormat(h.dtype(), h.topk_pairs(), h.length());
  if (!format.ok()) return ToGrpcStatus(format.status());
  // A data-plane tensor, never compressed, tells of every run as it comes. Declared after the
  // slot: it is done with the slot's buffer before the buffer goes.
  std::unique_ptr<StageForwarder::Forward> forwarding =
      h.data_connection() != 0 && !h.last_piece_first() && replica_ != nullptr
          ? replica_->StartForward(slot->gradient())
          : nullptr;
  absl::Status read = source->ReadInto(slot->gradient(), *format, [&](absl::Span<const float> run) {
    slot->Seen(run);
    if (forwarding != nullptr) forwarding->Seen(run);
  });
  source.reset();  // a shared region is given back: the client may reuse it now
  if (forwarding != nullptr) slot->set_forward_tag(forwarding->Finish());
  if (!read.ok()) {
    // A data-plane payload that did not come is the plane's failure: the client sends over gRPC.
    const bool lost = h.data_connection() != 0 && read.code() != absl::StatusCode::kInvalidArgument;
    return lost ? DataPlaneLostStatus(std::string(read.message())) : ToGrpcStatus(read);
  }
  const int64_t payload = PayloadBytes(*format, static_cast<int64_t>(slot->gradient().size()));
  absl::StatusOr<PushOutcome> outcome = shard_->Commit(*std::move(slot));
  if (!outcome.ok()) return ToGrpcStatus(outcome.status());
  if (outcome->forward_tag_kept) forwarding->Named();
  RecordPush(h, payload, start);
  response->set_version(outcome->version);
  response->set_staleness(outcome->staleness);
  response->set_duplicate(outcome->duplicate);
  response->set_dropped(outcome->dropped);
  return grpc::Status::OK;
}

grpc::Status ShardService::CheckPlaneCaller(const DataPlane::Call& call, int worker_id,
                                            uint64_t connection, uint64_t transfer) {
  // Its connection, opened with a ticket AttachDataPlane gave the owner's token, stands for the
  // token: the call must be made as that worker (or observer) and name this connection and
  // transfer. A reserved owner's connection (the replica peer's) carries no client's call.
  if (worker_id != call.owner || DataPlane::ReservedOwner(call.owner)) {
    return grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        absl::StrCat("a call as worker ", worker_id, " on a data-plane connection of ",
                     call.owner < 0 ? "observer " : "worker ", call.owner));
  }
  if (connection != call.connection || transfer != call.transfer) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a call made on the data plane must name its connection and transfer");
  }
  return grpc::Status::OK;
}

DataPlane::CallAnswer ShardService::PushOnPlane(const DataPlane::Call& call,
                                                DataPlane::ReadValues read_values) {
  const absl::Time start = absl::Now();
  DataPlane::CallAnswer answer;
  v1::PushHeader h;
  // As Push: the token (refused before the request is looked at), the replica serves, a place
  // among the streams; then what the header claims.
  Admission admission(call.credential);
  answer.status =
      Admit(nullptr, CallNeeds("Push", Access::kWrite).Serving().Limit(&streams_), &admission);
  if (!answer.status.ok()) return answer;
  if (!h.ParseFromString(call.request)) {
    answer.status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "cannot parse Push header");
  } else if (h.shm_segment() != 0 || h.topk_pairs() != 0) {
    answer.status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "a push made on the data plane carries its tensor there, "
                                 "uncompressed");
  } else if (h.last_piece_first() &&
             (h.dtype() != v1::FLOAT32 || (replica_ != nullptr && replica_->forwards()))) {
    answer.status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "a push sent last piece first is float32, to a shard that "
                                 "said it takes one");
  } else {
    answer.status = CheckPlaneCaller(call, h.worker_id(), h.data_connection(), h.data_transfer());
  }
  if (!answer.status.ok()) {
    shard_->RecordRejectedPush();
    return answer;
  }
  answer.status = Admit(
      nullptr,
      CallNeeds("Push", Access::kWrite).ActsAs(h.worker_id()).ShardIncarnation(h.shard_incarnation()),
      &admission);
  if (!answer.status.ok()) {
    if (!IsShardRestarted(answer.status)) shard_->RecordRejectedPush();
    return answer;
  }
  v1::PushResponse response;
  answer.status = ApplyPush(
      h,
      std::make_unique<PlaneCallPayload>(
          read_values, h.last_piece_first() ? ValuesOrder::kLastPieceFirst : ValuesOrder::kInOrder),
      start, &response);
  if (answer.status.ok()) answer.status = WaitReplicated(call.deadline);
  if (answer.status.ok()) answer.response = response.SerializeAsString();
  return answer;
}

// A Pull made on the data plane (DataPlane::Call), once checked: waits (without a thread) for
// the shard to admit it, sends the values on the plane as they are copied, then answers with what
// heads a gRPC Pull's answer. Deletes itself once it answered.
class ShardService::PlanePull {
 public:
  PlanePull(ShardService* service, const DataPlane::Call& call, WireType type,
            Admission admission, DataPlane::Answer answer)
      : service_(service),
        id_(service->HoldPlanePull(call.connection)),
        type_(type),
        admission_(std::move(admission)),
        answer_(std::move(answer)),
        plane_(service->data_plane_, call.connection, call.owner, call.transfer, type,
               call.deadline) {}

  void Start(const v1::PullRequest& r, absl::Time deadline) {
    ParameterShard::ReadRequest read = ReadOf(r, deadline);
    read.filling = [this](absl::Span<const float> buffer) { return plane_.Start(buffer); };
    // `this` may be gone once StartRead returned (answered at once, or meanwhile).
    ShardService* const service = service_;
    const int64_t id = id_;
    const int64_t ticket = service->shard_->StartRead(
        std::move(read),
        [this](absl::StatusOr<ParameterShard::Snapshot> s) { OnAnswer(std::move(s)); });
    if (ticket != 0) service->PlanePullWaits(id, ticket);
  }

 private:
  void OnAnswer(absl::StatusOr<ParameterShard::Snapshot> answer) {
    if (!answer.ok()) {
      Finish({ToGrpcStatus(answer.status()), ""});
      return;
    }
    snapshot_.emplace(*std::move(answer));
    plane_.Answered(snapshot_->values.span(), [this](grpc::Status lost, int64_t saturated) {
      if (!lost.ok()) {
        Finish({lost, ""});
        return;
      }
      service_->NoteSaturated(saturated, type_);
      service_->data_plane_pulls_.fetch_add(1, std::memory_order_relaxed);
      service_->RecordPull(static_cast<int64_t>(snapshot_->values.span().size()) * WireBytes(type_),
                           start_);
      Finish({grpc::Status::OK, PlanePullHead(*snapshot_, type_).SerializeAsString()});
    });
  }
  void Finish(DataPlane::CallAnswer a) {
    service_->ForgetPlanePull(id_);
    DataPlane::Answer answer = std::move(answer_);
    delete this;
    answer(std::move(a));
  }

  ShardService* const service_;
  const int64_t id_;  // among the service's plane pulls
  const WireType type_;
  const absl::Time start_ = absl::Now();
  const Admission admission_;  // its place among the shard's pulls in progress
  DataPlane::Answer answer_;
  std::optional<ParameterShard::Snapshot> snapshot_;
  PlaneSend plane_;
};

void ShardService::PullOnPlane(const DataPlane::Call& call, DataPlane::Answer answer) {
  // As Pull: the token and a place among the pulls (a worker's own token, and the observers and
  // operator together, under their cap), then what the request claims. A connection's calls are
  // read one at a time, but a held pull's answer comes later, holding its place until then.
  Admission admission(call.credential);
  v1::PullRequest r;
  WireType type = WireType::kFloat32;
  grpc::Status checked =
      Admit(nullptr, CallNeeds("Pull", Access::kRead).Limit(&pulls_), &admission);
  if (checked.ok() && !r.ParseFromString(call.request)) {
    checked = InvalidArgument("cannot parse Pull request");
  }
  if (checked.ok()) {
    checked = CheckPlaneCaller(call, r.worker_id(), r.data_connection(), r.data_transfer());
  }
  if (checked.ok()) {
    checked = Admit(nullptr, CallNeeds("Pull", Access::kRead).ActsAs(r.worker_id()), &admission);
  }
  if (checked.ok() && r.dtype() != v1::DTYPE_UNSPECIFIED) {
    absl::StatusOr<WireType> t = WireTypeOfDType(r.dtype());
    checked = ToGrpcStatus(t.status());
    if (t.ok()) type = *t;
  }
  if (checked.ok()) {
    checked = Admit(
        nullptr,
        CallNeeds("Pull", Access::kRead).Serving().ShardIncarnation(r.shard_incarnation()),
        &admission);
  }
  if (checked.ok() && (r.compress() != v1::DTYPE_UNSPECIFIED || r.shm_segment() != 0)) {
    checked = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                           "a pull made on the data plane takes its values there, uncompressed");
  }
  if (!checked.ok()) {
    answer({checked, ""});
    return;
  }
  (new PlanePull(this, call, type, std::move(admission), std::move(answer)))
      ->Start(r, AnswerBy(call.deadline));
}

int64_t ShardService::HoldPlanePull(uint64_t connection) {
  absl::MutexLock lock(&plane_pulls_mu_);
  const int64_t id = next_plane_pull_++;
  plane_pulls_[id].connection = connection;
  return id;
}

void ShardService::PlanePullWaits(int64_t id, int64_t ticket) {
  {
    absl::MutexLock lock(&plane_pulls_mu_);
    auto it = plane_pulls_.find(id);
    if (it == plane_pulls_.end()) return;  // answered already
    it->second.ticket = ticket;
    if (!it->second.ended) return;
  }
  shard_->CancelRead(ticket);  // its connection ended before its ticket was known
}

void ShardService::ForgetPlanePull(int64_t id) {
  absl::MutexLock lock(&plane_pulls_mu_);
  plane_pulls_.erase(id);
}

void ShardService::PlanePullEnded(uint64_t connection) {
  std::vector<int64_t> held;
  {
    absl::MutexLock lock(&plane_pulls_mu_);
    for (auto& [id, pull] : plane_pulls_) {
      if (pull.connection != connection) continue;
      pull.ended = true;
      if (pull.ticket != 0) held.push_back(pull.ticket);
    }
  }
  // Each answered CANCELLED (an answer no one reads now); a ticket answered meanwhile is no
  // longer the shard's to cancel.
  for (int64_t ticket : held) shard_->CancelRead(ticket);
}

grpc::Status ShardService::OpenPushPayload(grpc::ServerContext* context,
                                           grpc::ServerReader<grpc::ByteBuffer>* reader,
                                           const v1::PushHeader& h,
                                           std::optional<TensorMessage> data, Admission* admission,
                                           std::unique_ptr<PayloadSource>* source) {
  if (h.data_connection() != 0) {
    if (data_plane_ == nullptr) return DataPlaneLostStatus("this shard has no data plane");
    const absl::Time deadline = AnswerBy(absl::FromChrono(context->deadline()));
    absl::StatusOr<std::unique_ptr<DataPlanePayload>> opened =
        DataPlanePayload::Open(data_plane_, context, reader, *data, h.data_connection(),
                               h.data_transfer(), h.worker_id(), deadline);
    if (!opened.ok()) {
      shard_->RecordRejectedPush();
      return ToGrpcStatus(opened.status());
    }
    *source = *std::move(opened);
    return grpc::Status::OK;
  }
  if (h.shm_segment() == 0) {
    *source = std::make_unique<StreamPayload<v1::PushChunk>>(reader, *std::move(data),
                                                             &admission->guard());
    return grpc::Status::OK;
  }
  absl::StatusOr<std::unique_ptr<SharedPayload>> taken =
      SharedPayload::Take(segments_, reader, *data, h.shm_segment(), h.shm_ticket(), h.worker_id());
  if (taken.ok()) {
    *source = *std::move(taken);
    return grpc::Status::OK;
  }
  if (taken.status().code() == absl::StatusCode::kInvalidArgument) {
    shard_->RecordRejectedPush();
    return ToGrpcStatus(taken.status());
  }
  return SharedMemoryLostStatus(std::string(taken.status().message()));
}

void ShardService::RecordPush(const v1::PushHeader& h, int64_t payload, absl::Time start) {
  if (h.shm_segment() != 0) shm_pushes_.fetch_add(1, std::memory_order_relaxed);
  if (h.data_connection() != 0) data_plane_pushes_.fetch_add(1, std::memory_order_relaxed);
  if (metrics_.push_seconds != nullptr) {
    metrics_.push_bytes->Increment(static_cast<double>(payload));
    metrics_.push_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
}

void ShardService::RecordPull(int64_t payload, absl::Time start) {
  if (metrics_.pull_seconds != nullptr) {
    metrics_.pull_bytes->Increment(static_cast<double>(payload));
    metrics_.pull_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
}

void ShardService::NoteSaturated(int64_t saturated, WireType type) {
  if (saturated > 0 && !pull_saturated_.exchange(true)) {
    PS_LOG(WARNING) << "a pulled weight beyond " << WireTypeName(type)
                    << "'s range was sent as its largest (logged once)";
  }
}

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

grpc::ServerUnaryReactor* ShardService::Heartbeat(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request,
                                                  grpc::ByteBuffer* response) {
  return Unary<v1::HeartbeatRequest, v1::HeartbeatResponse>(
      context, request, response, CallNeeds("Heartbeat", Access::kWrite),
      [](const auto& r, CallNeeds needs) {
        return needs.ActsAs(r.worker_id()).Serving().ShardIncarnation(r.shard_incarnation());
      },
      [&](const auto& request, auto* response) {
        absl::StatusOr<int> active = shard_->Heartbeat(request.worker_id(), request.incarnation());
        if (!active.ok()) return ToGrpcStatus(active.status());
        response->set_active_workers(*active);
        return grpc::Status::OK;
      });
}

grpc::ServerUnaryReactor* ShardService::Leave(grpc::CallbackServerContext* context,
                                              const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response) {
  return Unary<v1::LeaveRequest, v1::LeaveResponse>(
      context, request, response, CallNeeds("Leave", Access::kWrite),
      [](const auto& r, CallNeeds needs) {
        return needs.ActsAs(r.worker_id()).Serving().ShardIncarnation(r.shard_incarnation());
      },
      [&](const auto& request, auto*) {
        absl::Status left = shard_->Leave(request.worker_id(), request.incarnation());
        if (left.ok()) segments_.Release(request.worker_id());
        if (left.ok()) pull_views_.Forget(request.worker_id());
        if (left.ok() && data_plane_ != nullptr) data_plane_->Release(request.worker_id());
        return ToGrpcStatus(left);
      });
}

grpc::ServerUnaryReactor* ShardService::GetStats(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) {
  return Unary<v1::StatsRequest, v1::StatsResponse>(
      context, request, response, CallNeeds("GetStats", Access::kRead),
      [](const auto&, CallNeeds needs) { return needs; },
      [&](const auto& request, auto* response) {
        int page = request.max_workers();
        if (page <= 0) page = ParameterShard::kMaxStatsWorkers;
        *response = StatsProto(shard_->Stats(request.first_worker(), page));
        return grpc::Status::OK;
      });
}

grpc::ServerUnaryReactor* ShardService::Checkpoint(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) {
  return Unary<v1::CheckpointRequest, v1::CheckpointResponse>(
      context, request, response, CallNeeds("Checkpoint", Access::kAdmin),
      [](const auto& r, CallNeeds needs) { return needs.ShardIncarnation(r.shard_incarnation()); },
      [&](const auto&, auto* response) {
        if (checkpointer_ == nullptr) {
          return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                              "this shard keeps no checkpoints (ps --checkpoint_dir)");
        }
        if (replica_ != nullptr && replica_->role() != Replica::Role::kPrimary) {
          return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                              "this replica is not its shard's primary: ask the primary");
        }
        absl::StatusOr<Checkpointer::Written> written = checkpointer_->WriteNow();
        if (!written.ok() && written.status().code() != absl::StatusCode::kFailedPrecondition) {
          // Not "unavailable" (a client would retry it): the disk said no.
          return grpc::Status(grpc::StatusCode::INTERNAL,
                              absl::StrCat("checkpoint failed: ", written.status().message()));
        }
        if (!written.ok()) return ToGrpcStatus(written.status());
        response->set_version(written->version);
        response->set_path(written->path);
        return grpc::Status::OK;
      });
}

template <typename Request>
ShardService::CallNeeds ShardService::AttachClaims(const Request& r, CallNeeds needs) {
  return needs.ActsAs(r.worker_id()).Serving().ShardIncarnation(r.shard_incarnation());
}

absl::Status ShardService::CheckAttacher(int worker, const v1::ModelIdentity& model) const {
  absl::Status checked = shard_->CheckModel(FromProto(model));
  if (checked.ok() && worker >= 0) checked = shard_->CheckWorkerId(worker);
  return checked;
}

grpc::ServerUnaryReactor* ShardService::AttachSharedMemory(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* request,
                                                           grpc::ByteBuffer* response) {
  return Unary<v1::AttachSharedMemoryRequest, v1::AttachSharedMemoryResponse>(
      context, request, response, CallNeeds("AttachSharedMemory", Access::kRead),
      AttachClaims<v1::AttachSharedMemoryRequest>, [&](const auto& request, auto* response) {
        const int worker = request.worker_id();
        if (absl::Status s = CheckAttacher(worker, request.model()); !s.ok())
          return ToGrpcStatus(s);
        if (ProcessSpaceId().empty() || request.process_space() != ProcessSpaceId()) {
          return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                              "the client runs on another host or in another PID namespace");
        }
        absl::StatusOr<SharedSegments::Attached> attached = segments_.Attach(worker);
        if (!attached.ok()) return ToGrpcStatus(attached.status());
        response->set_segment(attached->id);
        response->set_pid(getpid());
        response->set_fd(attached->segment->fd());
        response->set_nonce(attached->segment->nonce());
        response->set_region_bytes(attached->segment->region_bytes());
        return grpc::Status::OK;
      });
}

grpc::ServerUnaryReactor* ShardService::AttachDataPlane(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  return Unary<v1::AttachDataPlaneRequest, v1::AttachDataPlaneResponse>(
      context, request, response, CallNeeds("AttachDataPlane", Access::kRead),
      AttachClaims<v1::AttachDataPlaneRequest>,
      [&](const auto& request, auto* response, const Admission& admission) {
        const int worker = request.worker_id();
        if (DataPlane::ReservedOwner(worker)) {  // the server's own (a backup's join gives them)
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              absl::StrCat("worker id ", worker, " is no client's"));
        }
        if (absl::Status s = CheckAttacher(worker, request.model()); !s.ok())
          return ToGrpcStatus(s);
        if (data_plane_ == nullptr) {
          return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                              "this shard has no data plane (ps --data_plane_port=-1)");
        }
        absl::StatusOr<DataPlane::Ticket> ticket =
            data_plane_->Issue(worker, admission.credential());
        if (!ticket.ok()) return ToGrpcStatus(ticket.status());
        response->set_port(data_plane_->port());
        response->set_connection(ticket->connection);
        response->set_secret(ticket->secret);
        response->set_lanes(ticket->lanes);
        response->set_calls(true);
        response->set_last_piece_first(replica_ == nullptr || !replica_->forwards());
        return grpc::Status::OK;
      });
}

v1::StatsResponse ShardService::StatsProto(const ShardStats& s) const {
  v1::StatsResponse r;
  if (replica_ != nullptr) {
    r.set_replica_role(RoleMachine::RoleName(replica_->role()));
    r.set_replica_epoch(replica_->epoch());
    r.set_replica_changes_forwarded(replica_->changes_forwarded());
    r.set_replica_stages_sending(replica_->stages_sending());
  }
  r.set_shard_incarnation(process_.incarnation);
  r.set_resumed_version(process_.resumed_version);
  r.set_updates_lost(process_.updates_lost);
  r.set_shard_index(s.shard_index);
  r.set_num_shards(s.num_shards);
  r.set_initialized(s.initialized);
  r.set_begin(s.range.begin);
  r.set_end(s.range.end);
  r.set_version(s.version);
  r.set_pushes_applied(s.pushes_applied);
  r.set_pushes_rejected(s.pushes_rejected);
  r.set_pushes_duplicate(s.pushes_duplicate);
  r.set_pushes_dropped_late(s.pushes_dropped_late);
  r.set_pushes_dropped_stale(s.pushes_dropped_stale);
  r.set_pushes_dropped_norm(s.pushes_dropped_norm);
  r.set_pulls(s.pulls);
  r.set_pulls_waiting(s.pulls_waiting);
  r.set_registered_workers(s.registered_workers);
  r.set_active_workers(s.active_workers);
  r.set_learning_rate(s.learning_rate);
  r.set_updates_nonfinite(s.updates_nonfinite);
  r.set_pushes_clipped(s.pushes_clipped);
  r.set_next_worker(s.next_worker);
  r.set_model_fingerprint(s.model_fingerprint);
  r.set_optimizer(s.optimizer);
  r.set_consistency(s.consistency);
  for (int64_t c : s.staleness_counts) r.add_staleness_counts(c);
  for (const WorkerSnapshot& w : s.workers) {
    v1::WorkerStats* out = r.add_workers();
    out->set_worker_id(w.worker_id);
    out->set_active(w.active);
    out->set_clock(w.clock);
    out->set_pushes_applied(w.pushes_applied);
    out->set_seconds_since_seen(w.seconds_since_seen);
    out->set_incarnation(w.incarnation);
    for (int64_t c : w.staleness_counts) out->add_staleness_counts(c);
  }
  r.set_shm_pushes(shm_pushes_.load(std::memory_order_relaxed));
  r.set_shm_pulls(shm_pulls_.load(std::memory_order_relaxed));
  r.set_shm_segments(segments_.size());
  r.set_data_plane_pushes(data_plane_pushes_.load(std::memory_order_relaxed));
  r.set_data_plane_pulls(data_plane_pulls_.load(std::memory_order_relaxed));
  if (data_plane_ != nullptr) r.set_data_plane_connections(data_plane_->connections());
  r.set_compressed_pulls(compressed_pulls_.load(std::memory_order_relaxed));
  r.set_pulls_refused(pulls_.refused());
  r.set_streams_refused(streams_.refused());
  r.set_pull_views(pull_views_.size());
  if (checkpointer_ != nullptr) {
    const Checkpointer::Health health = checkpointer_->health();
    r.set_checkpoint_failures(health.failures);
    r.set_checkpoint_last_error(health.last_error);
    r.set_checkpoint_last_written_version(health.last_written_version);
    if (health.last_written_time != absl::InfinitePast()) {
      r.set_checkpoint_last_written_time(
          absl::ToDoubleSeconds(health.last_written_time - absl::UnixEpoch()));
    }
  }
  return r;
}

}  // namespace ps
