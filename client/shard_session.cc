#include "client/shard_session.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cluster.h"
#include "common/log.h"
#include "common/version.h"
#include "transport/channel_options.h"
#include "transport/grpc_status.h"

namespace ps {
ShardSession::ShardSession(int index, const std::string& addresses, Range range, Client client)
    : index_(index), range_(range), client_(std::move(client)) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = client_.options->security.credentials;
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  for (const std::string& address : ShardReplicas(addresses)) {
    auto replica = std::make_unique<Replica>();
    replica->address = address;
    replica->rpc = std::make_unique<GrpcPath>(
        grpc::CreateCustomChannel(address, credentials, ShardChannelArguments()));
    replicas_.push_back(std::move(replica));
  }
  const ClientOptions& options = *client_.options;
  if (options.compression.compressor != Compressor::kNone) {
    compression_.pushes = std::make_unique<PushCompressor>(
        options.compression, options.error_feedback, std::vector<int64_t>{range_.size()});
  }
  if (options.pull_compression.compressor != Compressor::kNone && client_.worker_id >= 0) {
    compression_.pulls = std::make_unique<CompressedPulls>(options.pull_compression);
  }
}

int ShardSession::current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

bool ShardSession::reached() const {
  return std::any_of(replicas_.begin(), replicas_.end(), [](const std::unique_ptr<Replica>& r) {
    return r->reached.load(std::memory_order_relaxed);
  });
}

bool ShardSession::SwitchReplica(int replica, const absl::Status& failure) {
  const int count = replicas();
  if (count < 2) return false;
  {
    absl::MutexLock lock(&mu_);
    if (current_ != replica) return false;
    current_ = (replica + 1) % count;
  }
  PS_LOG(WARNING) << "shard " << index_ << " (" << replicas_[replica]->address
                  << "): " << failure.message() << "; trying its other replica, "
                  << replicas_[(replica + 1) % count]->address;
  return true;
}

ProbeFinding ShardSession::Probe(Replica& replica, const ClientSecurity& security) const {
  {
    absl::MutexLock lock(&replica.mu);
    if (absl::Now() - replica.probed_at < absl::Seconds(5)) return replica.finding;
  }
  // Calls that meet the same replica meanwhile may probe it too: a few probes, no lock held.
  ProbeFinding finding = ProbeShard(replica.address, security);
  absl::MutexLock lock(&replica.mu);
  replica.probed_at = absl::Now();
  replica.finding = finding;
  return finding;
}

ShardSession::State ShardSession::state() const {
  absl::MutexLock lock(&mu_);
  State s = state_;
  s.shared_memory = shared_ != nullptr;
  return s;
}

int ShardSession::reregistrations() const {
  absl::MutexLock lock(&mu_);
  return reregistrations_;
}

grpc::Status ShardSession::Register(grpc::ClientContext* context, int64_t resume_sequence,
                                    const Attempter& attempt) {
  v1::RegisterRequest request;
  request.set_worker_id(client_.worker_id);
  *request.mutable_model() = client_.model;
  if (resume_sequence >= 0) request.set_resume_sequence(resume_sequence);
  request.set_num_workers(client_.options->num_workers);
  if (client_.layout.size() <= kMaxLayoutSent) request.set_layout(client_.layout);
  StampRelease(&request);
  v1::RegisterResponse response;
  grpc::Status status = current_replica().rpc->stub()->Register(context, request, &response);
  if (!status.ok()) return status;
  if (absl::Status s = CheckRelease(response, "shard", "client"); !s.ok()) return ToGrpcStatus(s);
  if (response.shard_index() != index_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("this address serves shard ", response.shard_index(),
                                     ", listed as shard ", index_, " in --ps"));
  }
  // Shared memory with a shard on this host, else the data plane, else gRPC.
  absl::StatusOr<std::shared_ptr<SharedMemoryPath>> shared =
      AttachSharedMemory(response.incarnation(), response.shard_incarnation(), attempt);
  absl::StatusOr<std::shared_ptr<DataPlanePath>> data =
      shared.ok() ? nullptr
                  : ConnectDataPlane(response.incarnation(), response.shard_incarnation(), attempt);
  PS_LOG(INFO) << "shard " << index_ << " (" << address() << "): tensors "
               << (shared.ok() ? "through shared memory"
                   : data.ok()
                       ? "over the data plane"
                       : absl::StrCat("over gRPC (no shared memory: ", shared.status().message(),
                                      "; no data plane: ", data.status().message(), ")"));
  absl::MutexLock lock(&mu_);
  if (state_.initialized && !response.initialized()) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("shard ", index_,
                     " restarted without the model it held (it had reached "
                     "version ",
                     state_.version, "); the job cannot go on without it. ", kLostModelFix));
  }
  state_ = State{response.incarnation(),   response.shard_incarnation(),
                 response.version(),       response.version(),
                 response.last_sequence(), response.initialized() || state_.initialized,
                 response.consistency()};
  shared_ = shared.ok() ? *shared : nullptr;
  data_ = data.ok() ? *data : nullptr;
  retry_at_ = absl::InfiniteFuture();
  backoff_ = kRetryFirst;
  if (!shared.ok() && !data.ok()) ScheduleRetry(data.status());
  return grpc::Status::OK;
}

AttemptEnd ShardSession::Reregister(int64_t stale, int64_t resume_sequence,
                                    const Attempter& attempt) {
  absl::MutexLock registering(&register_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (state_.shard_incarnation != stale) return AttemptEnd();  // done already
  }
  AttemptEnd end = attempt([&](grpc::ClientContext* context) {
    return AttemptEnd::FromShard(Register(context, resume_sequence, attempt));
  });
  if (end.ok()) {
    absl::MutexLock lock(&mu_);
    ++reregistrations_;
    PS_LOG(INFO) << "registered again with shard " << index_ << " (" << replicas_[current_]->address
                 << "), now at version " << state_.version;
  }
  return end;
}

absl::StatusOr<std::shared_ptr<SharedMemoryPath>> ShardSession::AttachSharedMemory(
    int64_t incarnation, int64_t shard_incarnation, const Attempter& attempt) {
  if (!client_.options->shared_memory) return absl::FailedPreconditionError("off");
  if (ProcessSpaceId().empty()) return absl::FailedPreconditionError("no process space id");
  v1::AttachSharedMemoryRequest request;
  request.set_worker_id(client_.worker_id);
  *request.mutable_model() = client_.model;
  request.set_process_space(ProcessSpaceId());
  request.set_shard_incarnation(shard_incarnation);
  request.set_incarnation(incarnation);
  v1::AttachSharedMemoryResponse response;
  // One attempt, cancelled with the others (CancelPending); a failure only means another path.
  AttemptEnd attached = attempt([&](grpc::ClientContext* context) {
    return AttemptEnd::FromShard(
        current_replica().rpc->stub()->AttachSharedMemory(context, request, &response));
  });
  if (!attached.status.ok()) return attached.status;
  if (response.region_bytes() < range_.size() * WireBytes(WireType::kFloat32)) {
    return absl::FailedPreconditionError("its segment is smaller than its range");
  }
  absl::StatusOr<SharedSegment> segment =
      SharedSegment::Open(response.pid(), response.fd(), response.nonce(), response.region_bytes());
  if (!segment.ok()) return segment.status();
  return std::make_shared<SharedMemoryPath>(response.segment(), *std::move(segment));
}

absl::StatusOr<std::shared_ptr<DataPlanePath>> ShardSession::ConnectDataPlane(
    int64_t incarnation, int64_t shard_incarnation, const Attempter& attempt) {
  const ClientOptions& options = *client_.options;
  if (!options.data_plane) return absl::FailedPreconditionError("off");
  const int replica = current();
  v1::AttachDataPlaneRequest request;
  request.set_worker_id(client_.worker_id);
  *request.mutable_model() = client_.model;
  request.set_shard_incarnation(shard_incarnation);
  request.set_incarnation(incarnation);
  StampRelease(&request);
  v1::AttachDataPlaneResponse response;
  AttemptEnd attached = attempt([&](grpc::ClientContext* context) {
    return AttemptEnd::FromShard(
        replicas_[replica]->rpc->stub()->AttachDataPlane(context, request, &response));
  });
  if (!attached.status.ok()) return attached.status;
  std::string host, port;
  SplitHostPort(replicas_[replica]->address, &host, &port);
  absl::StatusOr<std::unique_ptr<DataConnection>> connection =
      DataConnection::Open({host, response.port(), response.connection(), response.secret(),
                            std::max(response.lanes(), 1), response.calls(),
                            options.security.plane_tls, response.last_piece_first()},
                           static_cast<uint64_t>(range_.size()) * sizeof(float),
                           absl::Now() + options.rpc_timeout, options.rpc_timeout);
  if (!connection.ok()) return connection.status();
  return std::make_shared<DataPlanePath>(*std::move(connection), replica);
}

std::shared_ptr<DataPlanePath> ShardSession::DataNow() const {
  return data_ != nullptr && data_->replica() == current_ ? data_ : nullptr;
}

ShardSession::Paths ShardSession::paths() const {
  absl::MutexLock lock(&mu_);
  return {shared_, DataNow(), replicas_[current_]->rpc.get()};
}

AttemptEnd ShardSession::OnPaths(grpc::ClientContext* context,
                                 const std::function<AttemptEnd(TensorPath&, const PathCall&)>& fn,
                                 const Attempter& attempt) {
  const Paths paths = this->paths();
  const std::shared_ptr<DataPlanePath>& data = paths.data;
  GrpcPath* rpc = paths.rpc;
  TensorPath* const order[] = {paths.shared.get(), data.get(), rpc};
  const bool compressing = compression_.pushes != nullptr || compression_.pulls != nullptr;
  for (TensorPath* path : order) {
    if (path == nullptr) continue;
    CompressedPath compressed(*path, compression_);
    AttemptEnd end = fn(compressing ? compressed : *path, PathCall{context, rpc});
    if (end.kind == AttemptEnd::Kind::kNotTaken) continue;
    if (end.kind == AttemptEnd::Kind::kPathLost) Drop(path, end.status.message());
    if (end.kind == AttemptEnd::Kind::kDroppedHere && path == data.get() &&
        data->connection().ended()) {
      RenewData(data, attempt);
    }
    return end;
  }
  return AttemptEnd::Answered(absl::InternalError("no path took the part"));  // gRPC always does
}

AttemptEnd ShardSession::Pull(grpc::ClientContext* context, absl::Span<float> values,
                              int64_t after_sequence, ValuesSeen seen, const Attempter& attempt,
                              Served* served) {
  RetryPaths(attempt);
  const ClientOptions& options = *client_.options;
  PullPart part{{}, values, options.pull_type, seen};
  v1::PullRequest& request = part.request;
  request.set_offset(range_.begin);
  request.set_length(range_.size());
  request.set_worker_id(client_.worker_id);
  if (after_sequence >= 0) request.set_after_sequence(after_sequence);
  request.set_shard_incarnation(state().shard_incarnation);
  request.set_dtype(static_cast<v1::DType>(options.pull_type));
  *request.mutable_model() = client_.model;
  v1::PullChunk answer;
  AttemptEnd end = OnPaths(
      context,
      [&](TensorPath& path, const PathCall& call) { return path.Pull(part, call, &answer); },
      attempt);
  if (!end.ok()) return end;
  *served = {answer.version(), request.shard_incarnation()};
  absl::MutexLock lock(&mu_);
  if (state_.shard_incarnation == request.shard_incarnation()) {
    state_.initialized = true;
    state_.version = std::max(state_.version, answer.version());
  }
  return end;
}

AttemptEnd ShardSession::Push(grpc::ClientContext* context, absl::Span<const float> values,
                              int64_t sequence, Served base, FillProgress* filling,
                              std::shared_ptr<const CompressedTensor>* compressed_once,
                              const Attempter& attempt, PushDone* done) {
  RetryPaths(attempt);
  const State session = state();
  if (base.shard_incarnation != 0 && base.shard_incarnation != session.shard_incarnation) {
    // Computed from an earlier process of this shard, whose updates since its checkpoint are
    // lost: the gradient is taken as computed from the version the shard came back at.
    base.version = std::min(base.version, session.registered_version);
  }
  const WireType type = client_.options->push_type;
  PushPart part{{}, values, type, nullptr, compressed_once, filling};
  v1::PushHeader& header = part.header;
  header.set_worker_id(client_.worker_id);
  header.set_incarnation(session.incarnation);
  header.set_shard_incarnation(session.shard_incarnation);
  header.set_sequence(sequence);
  header.set_base_version(base.version);
  header.set_offset(range_.begin);
  header.set_length(range_.size());
  header.set_dtype(static_cast<v1::DType>(type));
  return OnPaths(
      context, [&](TensorPath& path, const PathCall& call) { return path.Push(part, call, done); },
      attempt);
}

bool ShardSession::StreamsPush() const {
  absl::MutexLock lock(&mu_);
  const std::shared_ptr<DataPlanePath> data = DataNow();
  return shared_ == nullptr && data != nullptr && compression_.pushes == nullptr &&
         data->SendsAsFilled(range_.size());
}

void ShardSession::Drop(const TensorPath* path, absl::string_view why) {
  const char* after;
  {
    absl::MutexLock lock(&mu_);
    if (shared_.get() == path) {
      shared_ = nullptr;
    } else if (data_.get() == path) {
      data_ = nullptr;
    } else {
      return;  // dropped or replaced already
    }
    ScheduleRetry(absl::UnavailableError(why));
  }
  PS_LOG(WARNING) << "shard " << index_ << " (" << address() << "): " << path->name()
                  << " stopped working (" << why
                  << "); its tensors go over gRPC until it is attached again";
}

void ShardSession::ScheduleRetry(const absl::Status& why) {
  // Off here, absent there, or a shard of another version: asking again changes nothing.
  const absl::StatusCode code = why.code();
  if (code == absl::StatusCode::kFailedPrecondition || code == absl::StatusCode::kUnimplemented ||
      code == absl::StatusCode::kInvalidArgument) {
    retry_at_ = absl::InfiniteFuture();
    return;
  }
  retry_at_ = absl::Now() + backoff_;
  backoff_ = std::min(2 * backoff_, kRetryLast);
}

void ShardSession::RetryPaths(const Attempter& attempt) {
  int64_t incarnation = 0, shard_incarnation = 0;
  int replica = 0;
  {
    absl::MutexLock lock(&mu_);
    if (shared_ != nullptr || data_ != nullptr || absl::Now() < retry_at_) return;
    retry_at_ = absl::InfiniteFuture();  // this attempt's; the next set when it ends
    incarnation = state_.incarnation;
    shard_incarnation = state_.shard_incarnation;
    replica = current_;
  }
  client_.threads->Run(
      [this, incarnation, shard_incarnation, replica, attempt] {
        // Shared memory again where the shard is on this host (its segment may have been freed:
        // the lease expired), else the data plane.
        absl::StatusOr<std::shared_ptr<SharedMemoryPath>> shared =
            AttachSharedMemory(incarnation, shard_incarnation, attempt);
        absl::StatusOr<std::shared_ptr<DataPlanePath>> data =
            shared.ok() ? nullptr : ConnectDataPlane(incarnation, shard_incarnation, attempt);
        {
          absl::MutexLock lock(&mu_);
          if (state_.shard_incarnation != shard_incarnation || shared_ != nullptr ||
              data_ != nullptr || current_ != replica ||
              (data.ok() && *data != nullptr && (*data)->replica() != replica)) {
            return;  // registered again meanwhile, or another replica: that session decides
          }
          if (!shared.ok() && !data.ok()) {
            ScheduleRetry(data.status());
            return;
          }
          shared_ = shared.ok() ? *std::move(shared) : nullptr;
          data_ = data.ok() ? *std::move(data) : nullptr;
          backoff_ = kRetryFirst;
        }
        PS_LOG(INFO) << "shard " << index_ << " (" << address() << "): tensors "
                     << (shared.ok() ? "through shared memory" : "over the data plane") << " again";
      },
      [] {});
}

void ShardSession::RenewData(const std::shared_ptr<DataPlanePath>& data, const Attempter& attempt) {
  const State session = state();
  absl::StatusOr<std::shared_ptr<DataPlanePath>> fresh =
      ConnectDataPlane(session.incarnation, session.shard_incarnation, attempt);
  if (!fresh.ok()) {
    Drop(data.get(), fresh.status().message());
    return;
  }
  absl::MutexLock lock(&mu_);
  if (data_ == data) data_ = *std::move(fresh);
}

void ShardSession::EndData() {
  absl::MutexLock lock(&mu_);
  if (data_ != nullptr) data_->connection().End();
}

}  // namespace ps
