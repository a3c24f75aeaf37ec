#include "server/shard_service.h"

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/chunking.h"
#include "common/grpc_status.h"

namespace ps {
namespace {

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

// Reads the rest of a chunked stream (the first chunk already in `chunk`) into `dst`. Only the
// first chunk may carry a header.
template <typename Chunk>
absl::Status ReadPayload(grpc::ServerReader<Chunk>* reader, Chunk& chunk, absl::Span<float> dst) {
  ChunkAssembler assembler(dst);
  bool first = true;
  do {
    if (!first && chunk.has_header()) {
      return absl::InvalidArgumentError("a header appeared after the first chunk");
    }
    first = false;
    if (absl::Status s = assembler.Append(chunk.data()); !s.ok()) return s;
  } while (reader->Read(&chunk));
  return assembler.Finish();
}

grpc::Status CannotParse(const char* method) {
  return InvalidArgument(absl::StrCat("cannot parse ", method, " request"));
}

// Reads the one request of a unary call, answers it with handle(request, response) and sends the
// response if that succeeded.
template <typename Request, typename Response, typename Handler>
grpc::Status ServeUnary(const char* method, grpc::ServerUnaryStreamer<Request, Response>* stream,
                        Handler handle) {
  Request request;
  if (!stream->Read(&request)) return CannotParse(method);
  Response response;
  grpc::Status status = handle(&request, &response);
  if (status.ok()) stream->Write(response);
  return status;
}

}  // namespace

grpc::Status ShardService::StreamedRegister(
    grpc::ServerContext*,
    grpc::ServerUnaryStreamer<v1::RegisterRequest, v1::RegisterResponse>* stream) {
  return ServeUnary("Register", stream, [this](auto* request, auto* response) {
    return HandleRegister(request, response);
  });
}

grpc::Status ShardService::StreamedPull(
    grpc::ServerContext* context,
    grpc::ServerSplitStreamer<v1::PullRequest, v1::PullChunk>* stream) {
  v1::PullRequest request;
  if (!stream->Read(&request)) return CannotParse("Pull");
  return HandlePull(context, &request, stream);
}

grpc::Status ShardService::StreamedHeartbeat(
    grpc::ServerContext*,
    grpc::ServerUnaryStreamer<v1::HeartbeatRequest, v1::HeartbeatResponse>* stream) {
  return ServeUnary("Heartbeat", stream, [this](auto* request, auto* response) {
    return HandleHeartbeat(request, response);
  });
}

grpc::Status ShardService::StreamedLeave(
    grpc::ServerContext*, grpc::ServerUnaryStreamer<v1::LeaveRequest, v1::LeaveResponse>* stream) {
  return ServeUnary("Leave", stream, [this](auto* request, auto* response) {
    return HandleLeave(request, response);
  });
}

grpc::Status ShardService::StreamedGetStats(
    grpc::ServerContext*, grpc::ServerUnaryStreamer<v1::StatsRequest, v1::StatsResponse>* stream) {
  return ServeUnary("GetStats", stream, [this](auto*, v1::StatsResponse* response) {
    return HandleGetStats(response);
  });
}

grpc::Status ShardService::HandleRegister(const v1::RegisterRequest* request,
                                          v1::RegisterResponse* response) {
  absl::StatusOr<Registration> r =
      shard_->Register(request->worker_id(), FromProto(request->model()));
  if (!r.ok()) return ToGrpcStatus(r.status());
  response->set_shard_index(r->shard_index);
  response->set_initialized(r->initialized);
  response->set_begin(r->range.begin);
  response->set_end(r->range.end);
  response->set_version(r->version);
  response->set_last_sequence(r->last_sequence);
  response->set_consistency(r->consistency);
  return grpc::Status::OK;
}

grpc::Status ShardService::Initialize(grpc::ServerContext*,
                                      grpc::ServerReader<v1::InitializeChunk>* reader,
                                      v1::InitializeResponse* response) {
  v1::InitializeChunk chunk;
  if (!reader->Read(&chunk)) return InvalidArgument("empty Initialize stream");
  if (!chunk.has_header()) return InvalidArgument("the first Initialize chunk has no header");
  const v1::InitializeHeader& h = chunk.header();
  ModelIdentity model = FromProto(h.model());
  if (absl::Status s = CheckDType(h.dtype()); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<Range> range = shard_->CheckInitialize(model, h.offset(), h.length());
  if (!range.ok()) return ToGrpcStatus(range.status());
  if (shard_->initialized()) {  // a restarted initialiser: keep the trained values, skip the data
    response->set_applied(false);
    return grpc::Status::OK;
  }
  if (!shard_->TryBeginInitialize()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "another initialisation is in progress");
  }
  absl::Cleanup end_initialize = [this] { shard_->EndInitialize(); };
  std::vector<float> values(range->size());
  int64_t offset = h.offset();
  if (absl::Status s = ReadPayload(reader, chunk, absl::MakeSpan(values)); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<bool> applied = shard_->Initialize(model, offset, values);
  if (!applied.ok()) return ToGrpcStatus(applied.status());
  response->set_applied(*applied);
  return grpc::Status::OK;
}

grpc::Status ShardService::Push(grpc::ServerContext*, grpc::ServerReader<v1::PushChunk>* reader,
                                v1::PushResponse* response) {
  v1::PushChunk chunk;
  absl::Status status;
  PushHeaderInfo header;
  if (!reader->Read(&chunk)) {
    status = absl::InvalidArgumentError("empty Push stream");
  } else if (!chunk.has_header()) {
    status = absl::InvalidArgumentError("the first Push chunk has no header");
  } else {
    const v1::PushHeader& h = chunk.header();
    header = PushHeaderInfo{h.worker_id(), h.sequence(), h.base_version(), h.offset(), h.length()};
    status = CheckDType(h.dtype());
    if (status.ok()) status = shard_->CheckPushHeader(header);
  }
  if (!status.ok()) {
    shard_->RecordRejectedPush();
    return ToGrpcStatus(status);
  }
  BufferPool::Lease gradient = push_buffers_.Acquire(header.length);
  if (status = ReadPayload(reader, chunk, gradient.span()); !status.ok()) {
    shard_->RecordRejectedPush();
    return ToGrpcStatus(status);
  }
  absl::StatusOr<PushOutcome> outcome = shard_->Push(header, gradient.span());
  if (!outcome.ok()) return ToGrpcStatus(outcome.status());
  response->set_version(outcome->version);
  response->set_staleness(outcome->staleness);
  response->set_duplicate(outcome->duplicate);
  response->set_dropped(outcome->dropped);
  return grpc::Status::OK;
}

grpc::Status ShardService::HandlePull(
    grpc::ServerContext* context, const v1::PullRequest* request,
    grpc::ServerSplitStreamer<v1::PullRequest, v1::PullChunk>* writer) {
  // Wait at most a minute, and answer a little before the client's deadline so that it learns
  // why (ABORTED: held back, pull again) instead of timing out.
  absl::Time deadline = std::min(absl::Now() + absl::Minutes(1),
                                 absl::FromChrono(context->deadline()) - absl::Milliseconds(250));
  absl::StatusOr<ParameterShard::Snapshot> snapshot =
      shard_->Read(FromProto(request->model()), request->worker_id(), request->offset(),
                   request->length(), deadline);
  if (!snapshot.ok()) return ToGrpcStatus(snapshot.status());
  v1::PullChunk chunk;
  bool ok = true;
  ForEachChunk(snapshot->values.span(), kChunkFloats, [&](int64_t index, std::string_view bytes) {
    if (!ok) return;
    chunk.set_version(snapshot->version);
    chunk.set_offset(snapshot->offset + index);
    chunk.set_dtype(v1::FLOAT32);
    chunk.set_data(bytes.data(), bytes.size());
    ok = writer->Write(chunk);
  });
  if (!ok) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away during Pull");
  return grpc::Status::OK;
}

grpc::Status ShardService::HandleHeartbeat(const v1::HeartbeatRequest* request,
                                           v1::HeartbeatResponse* response) {
  absl::StatusOr<int> active = shard_->Heartbeat(request->worker_id());
  if (!active.ok()) return ToGrpcStatus(active.status());
  response->set_active_workers(*active);
  return grpc::Status::OK;
}

grpc::Status ShardService::HandleLeave(const v1::LeaveRequest* request, v1::LeaveResponse*) {
  return ToGrpcStatus(shard_->Leave(request->worker_id()));
}

grpc::Status ShardService::HandleGetStats(v1::StatsResponse* response) {
  *response = StatsToProto(shard_->Stats());
  return grpc::Status::OK;
}

v1::StatsResponse StatsToProto(const ShardStats& s) {
  v1::StatsResponse r;
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
  r.set_pulls(s.pulls);
  r.set_registered_workers(s.registered_workers);
  r.set_active_workers(s.active_workers);
  r.set_learning_rate(s.learning_rate);
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
    for (int64_t c : w.staleness_counts) out->add_staleness_counts(c);
  }
  return r;
}

}  // namespace ps
