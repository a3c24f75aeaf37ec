#include "server/rpc/shard_service.h"

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/method_handler.h>
#include <unistd.h>

#include <optional>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/model_spec.h"
#include "common/tensor_layout.h"
#include "common/version.h"
#include "server/rpc/payload.h"
#include "server/rpc/service_helpers.h"
#include "transport/chunking.h"
#include "transport/grpc_method.h"
#include "transport/grpc_status.h"
#include "transport/shared_memory.h"

namespace ps {

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
  if (needs.acts_as && admission->owner_ && *needs.acts_as != *admission->owner_) {
    return grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        absl::StrCat(needs.call, " as worker ", *needs.acts_as, " on a data-plane connection of ",
                     *admission->owner_ < 0 ? "observer " : "worker ", *admission->owner_));
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

absl::Status ShardService::NamingLayoutDifference(absl::Status refused,
                                                  const v1::RegisterRequest& r) const {
  const ModelIdentity& held = shard_->model();
  if (refused.code() != absl::StatusCode::kFailedPrecondition ||
      r.model().fingerprint() == held.fingerprint || r.layout().size() > kMaxLayoutSent ||
      !IsInlineLayout(r.layout())) {
    return refused;
  }
  absl::StatusOr<TensorLayout> theirs = ParseTensorLayout(r.layout());
  // The shard's model as named tensors: its layout, or the tensors of the network its
  // fingerprint (a spec) names.
  absl::StatusOr<std::vector<TensorSlot>> ours =
      ModelTensors(held.layout.empty() ? held.fingerprint : held.layout);
  if (!theirs.ok() || !ours.ok()) return refused;
  const std::string difference = LayoutDifference(TensorLayout{*std::move(ours)},
                                                  "the shards' model", *theirs, "this client's");
  if (difference.empty()) return refused;
  return absl::FailedPreconditionError(absl::StrCat(refused.message(), ": ", difference));
}

grpc::ServerUnaryReactor* ShardService::Register(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) {
  return Unary<v1::RegisterRequest, v1::RegisterResponse>(
      context, request, response, CallNeeds("Register", Access::kRead),
      [](const auto& r, CallNeeds needs) { return needs.ActsAs(r.worker_id()).Serving(); },
      [&](const auto& request, auto* response) {
        if (absl::Status s = CheckRelease(request, "client", "shard"); !s.ok()) {
          return ToGrpcStatus(s);
        }
        if (absl::Status s = shard_->CheckNumWorkers(request.num_workers()); !s.ok()) {
          return ToGrpcStatus(s);
        }
        absl::StatusOr<Registration> r =
            shard_->Register(request.worker_id(), FromProto(request.model()),
                             request.has_resume_sequence() ? request.resume_sequence() : -1);
        if (!r.ok()) return ToGrpcStatus(NamingLayoutDifference(r.status(), request));
        response->set_shard_index(r->shard_index);
        response->set_initialized(r->initialized);
        response->set_begin(r->range.begin);
        response->set_end(r->range.end);
        response->set_version(r->version);
        response->set_last_sequence(r->last_sequence);
        response->set_consistency(r->consistency);
        response->set_incarnation(r->incarnation);
        response->set_shard_incarnation(process_.incarnation);
        StampRelease(response);
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
  if (h.path().last_piece_first() || h.path().data_connection() != 0) {
    shard_->RecordRejectedPush();
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a push whose tensor goes on the data plane is made there itself");
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
      h.path().data_connection() != 0 && !h.path().last_piece_first() && replica_ != nullptr
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
    const bool lost =
        h.path().data_connection() != 0 && read.code() != absl::StatusCode::kInvalidArgument;
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

grpc::Status ShardService::OpenPushPayload(grpc::ServerContext* context,
                                           grpc::ServerReader<grpc::ByteBuffer>* reader,
                                           const v1::PushHeader& h,
                                           std::optional<TensorMessage> data, Admission* admission,
                                           std::unique_ptr<PayloadSource>* source) {
  if (h.path().shm_segment() == 0) {
    *source = std::make_unique<StreamPayload<v1::PushChunk>>(reader, *std::move(data),
                                                             &admission->guard());
    return grpc::Status::OK;
  }
  absl::StatusOr<std::unique_ptr<SharedPayload>> taken = SharedPayload::Take(
      segments_, reader, *data, h.path().shm_segment(), h.path().shm_ticket(), h.worker_id());
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
  if (h.path().shm_segment() != 0) shm_pushes_.fetch_add(1, std::memory_order_relaxed);
  if (h.path().data_connection() != 0) data_plane_pushes_.fetch_add(1, std::memory_order_relaxed);
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
        if (left.ok()) ReleaseWorker(request.worker_id(), "the worker left");
        return ToGrpcStatus(left);
      });
}

void ShardService::ReleaseWorker(int worker, absl::string_view why) {
  segments_.Release(worker);
  pull_views_.Forget(worker);
  if (data_plane_ != nullptr) data_plane_->Release(worker, why);
  workers_released_.fetch_add(1, std::memory_order_relaxed);
}

grpc::ServerUnaryReactor* ShardService::GetStats(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) {
  return Unary<v1::StatsRequest, v1::StatsResponse>(
      context, request, response, CallNeeds("GetStats", Access::kRead),
      [](const auto&, CallNeeds needs) { return needs; },
      [&](const auto& request, auto* response) {
        if (request.wire_version() != 0) {  // none: a probe, answered (proto/ps.proto)
          if (absl::Status s = CheckRelease(request, "client", "shard"); !s.ok()) {
            return ToGrpcStatus(s);
          }
        }
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

absl::Status ShardService::CheckAttacher(int worker, const v1::ModelIdentity& model,
                                         int64_t incarnation) const {
  absl::Status checked = shard_->CheckModel(FromProto(model));
  if (checked.ok() && worker >= 0) checked = shard_->CheckWorkerId(worker);
  if (checked.ok() && worker >= 0 && incarnation != 0) {
    checked = shard_->CheckCurrent(worker, incarnation);
  }
  return checked;
}

grpc::ServerUnaryReactor* ShardService::AttachSharedMemory(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* request,
                                                           grpc::ByteBuffer* response) {
  return Unary<v1::AttachSharedMemoryRequest, v1::AttachSharedMemoryResponse>(
      context, request, response, CallNeeds("AttachSharedMemory", Access::kRead),
      AttachClaims<v1::AttachSharedMemoryRequest>, [&](const auto& request, auto* response) {
        const int worker = request.worker_id();
        if (absl::Status s = CheckAttacher(worker, request.model(), request.incarnation());
            !s.ok())
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
        if (absl::Status s = CheckRelease(request, "client", "shard"); !s.ok()) {
          return ToGrpcStatus(s);
        }
        if (absl::Status s = CheckAttacher(worker, request.model(), request.incarnation());
            !s.ok())
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
  StampRelease(&r);
  r.set_version_line(VersionLine());
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
  r.set_workers_released(workers_released_.load(std::memory_order_relaxed));
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
