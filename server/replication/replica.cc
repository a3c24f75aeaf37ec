#include "server/replication/replica.h"

#include <fcntl.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/support/method_handler.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "transport/chunking.h"
#include "common/cluster.h"
#include "transport/grpc_method.h"
#include "transport/grpc_status.h"
#include "common/log.h"
#include "transport/tensor_codec.h"
#include "server/replication/state_transfer.h"
#include "server/rpc/shard_service.h"

namespace ps {
namespace {

constexpr absl::Duration kHeartbeat = absl::Milliseconds(100);  // primary to backup, when idle
constexpr absl::Duration kTick = absl::Milliseconds(100);       // the role thread's pace
constexpr absl::Duration kProbeTimeout = absl::Milliseconds(500);
// A change made on the backup's data plane is answered once applied; a backup that takes longer
// is stuck (the stream ends, and pushes waiting for it fail at their own deadlines first).
constexpr absl::Duration kChangeTimeout = absl::Seconds(30);
// A stage goes as its push comes in: that push's own time (its call's deadline, a minute at
// most) and then the change's.
constexpr absl::Duration kStageTimeout = absl::Seconds(90);

// Writes `epoch` to `path` durably: a temporary file, fsync, rename.
absl::Status WriteEpoch(const std::string& path, int64_t epoch) {
  const std::string tmp = path + ".tmp";
  const std::string text = absl::StrCat(epoch, "\n");
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
            fsync(fd) == 0;
  if (fd >= 0) ok = close(fd) == 0 && ok;
  ok = ok && std::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok)
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", strerror(errno)));
  return absl::OkStatus();
}

// Parses raw request bytes into `message`; false if they are not one.
bool ParseRaw(const grpc::ByteBuffer& bytes, google::protobuf::MessageLite* message) {
  grpc::Slice flat;
  if (!bytes.TrySingleSlice(&flat).ok() && !bytes.DumpToSingleSlice(&flat).ok()) return false;
  return message->ParseFromArray(flat.begin(), static_cast<int>(flat.size()));
}

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

// The change `h` heads, its values still to come (values empty): DATA_LOSS for an unknown kind or
// more values than a shard of `size` holds.
absl::StatusOr<ShardChange> ChangeOf(const v1::ChangeHeader& h, int64_t size) {
  absl::StatusOr<ShardChange::Kind> kind = FromProto(h.kind());
  if (!kind.ok()) return kind.status();
  if (h.length() < 0 || h.length() > size) {
    return absl::DataLossError("a change longer than the shard");
  }
  return ShardChange{h.index(),    *kind,     FromProto(h.drop()), h.version(),      h.worker_id(),
                     h.sequence(), h.clock(), h.staleness(),       h.learning_rate()};
}

}  // namespace

const char* Replica::RoleName(Role role) {
  switch (role) {
    case Role::kBackup:
      return "backup";
    case Role::kPrimary:
      return "primary";
    case Role::kFenced:
      return "fenced";
    default:
      return "joining";
  }
}

Replica::Replica(ParameterShard* shard, int64_t shard_incarnation, Options options,
                 DataPlane* plane)
    : shard_(shard),
      shard_incarnation_(shard_incarnation),
      options_(std::move(options)),
      plane_(plane),
      change_values_(StageRoom(options_.forward_at_once) + 1) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = options_.security.credentials;
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
  peer_ = v1::Replication::NewStub(grpc::CreateCustomChannel(options_.peer, credentials, args));
}

Replica::~Replica() { Stop(); }

absl::Status Replica::CheckOptions(const Options& options) {
  if (options.forward_at_once < 1 ||
      options.forward_at_once > DataPlane::kMaxReplicaStageConnections) {
    return absl::InvalidArgumentError(
        absl::StrCat("--forward_at_once must be 1 to ", DataPlane::kMaxReplicaStageConnections));
  }
  return absl::OkStatus();
}

absl::Status Replica::Start() {
  if (absl::Status s = CheckOptions(options_); !s.ok()) return s;
  if (!options_.epoch_file.empty()) {
    std::ifstream in(options_.epoch_file);
    int64_t epoch = 0;
    if (in && !(in >> epoch)) {
      return absl::InvalidArgumentError(options_.epoch_file + " holds no epoch");
    }
    absl::MutexLock lock(&mu_);
    epoch_ = epoch;
    veteran_ = epoch > 0;
    if (veteran_) {
      PS_LOG(INFO) << "this replica took part in the job up to epoch " << epoch << " ("
                   << options_.epoch_file << "): it joins its peer, and starts no primary itself";
    }
  }
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

bool Replica::SetEpochLocked(int64_t epoch) {
  if (!options_.epoch_file.empty()) {
    if (absl::Status s = WriteEpoch(options_.epoch_file, epoch); !s.ok()) {
      PS_LOG(ERROR) << "not moving to epoch " << epoch << ": " << s.message();
      return false;
    }
  }
  epoch_ = epoch;
  veteran_ = true;
  return true;
}

void Replica::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (follow_context_ != nullptr) follow_context_->TryCancel();
  }
  log_.Close();
  if (thread_.joinable()) thread_.join();
}

int64_t Replica::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

bool Replica::veteran() const {
  absl::MutexLock lock(&mu_);
  return veteran_;
}

std::string Replica::fenced_reason() const {
  absl::MutexLock lock(&mu_);
  return fenced_reason_;
}

absl::Duration Replica::SilenceLocked() const { return absl::Now() - last_heard_; }

bool Replica::TakeOverLocked(absl::string_view why) {
  if (role_ != Role::kBackup || !caught_up_ || transferring_ ||
      SilenceLocked() < options_.failover || !SetEpochLocked(epoch_ + 1)) {
    return false;
  }
  role_ = Role::kPrimary;
  alone_ = true;
  stages_.clear();  // no change will name them
  if (follow_context_ != nullptr) follow_context_->TryCancel();
  PS_LOG(WARNING) << "took over as the primary of shard " << shard_->index() << " at epoch "
                  << epoch_ << " (" << why << "; the primary at " << options_.peer
                  << " was last heard from " << absl::FormatDuration(SilenceLocked())
                  << " ago), at version " << shard_->version()
                  << "; serving alone until a backup joins";
  return true;
}

void Replica::FenceLocked(std::string reason) {
  if (role_ == Role::kFenced) return;
  role_ = Role::kFenced;
  fenced_reason_ = std::move(reason);
  log_.Close();
  PS_LOG(ERROR) << fenced_reason_;
}

absl::Status Replica::CheckServing(bool may_take_over) {
  absl::MutexLock lock(&mu_);
  if (role_ == Role::kBackup && may_take_over) TakeOverLocked("a client found the primary gone");
  switch (role_) {
    case Role::kPrimary:
      if (alone_ || log_.attached()) return absl::OkStatus();
      return absl::UnavailableError(
          absl::StrCat("shard ", shard_->index(), ": this primary (epoch ", epoch_,
                       ") has no backup following it and acknowledges nothing until one joins"));
    case Role::kBackup:
      return absl::UnavailableError(absl::StrCat(
          "shard ", shard_->index(), ": this replica is the backup (its primary at ", options_.peer,
          " was heard from ", absl::FormatDuration(SilenceLocked()), " ago)"));
    case Role::kFenced:
      return absl::UnavailableError(fenced_reason_);
    default:
      return absl::UnavailableError(absl::StrCat(
          "shard ", shard_->index(), ": this replica is joining its primary at ", options_.peer));
  }
}

absl::Status Replica::WaitReplicated(absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (role_ == Role::kPrimary && alone_) return absl::OkStatus();
    if (role_ != Role::kPrimary) {
      return absl::UnavailableError(absl::StrCat("shard ", shard_->index(), ": this replica is ",
                                                 RoleName(role_), " now; not acknowledged"));
    }
  }
  return log_.WaitReplicated(deadline);
}

v1::ReplicaStatusResponse Replica::Status(bool take_over) {
  absl::MutexLock lock(&mu_);
  if (take_over) TakeOverLocked("its peer asked, finding no primary");
  v1::ReplicaStatusResponse r;
  r.set_shard_index(shard_->index());
  r.set_role(RoleName(role_));
  r.set_epoch(epoch_);
  r.set_shard_incarnation(shard_incarnation_);
  if (role_ == Role::kBackup) {
    r.set_seconds_since_primary(absl::ToDoubleSeconds(SilenceLocked()));
  }
  r.set_backup_attached(role_ == Role::kPrimary && log_.attached());
  r.set_caught_up(caught_up_ || role_ == Role::kPrimary);
  return r;
}

grpc::Status Replica::ProbePeer(bool take_over, v1::ReplicaStatusResponse* status) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kProbeTimeout));
  if (!options_.security.token.empty()) {
    context.AddMetadata(kAuthorizationMetadata, BearerValue(options_.security.token));
  }
  v1::ReplicaStatusRequest request;
  request.set_take_over(take_over);
  return peer_->Status(&context, request, status);
}

void Replica::Run() {
  // Roles take a few ticks to settle at start: nothing is worth a warning before 5 s.
  absl::Time next_complaint = absl::Now() + absl::Seconds(5);
  auto complain = [&](const std::string& what) {  // at most every 10 s
    if (absl::Now() < next_complaint) return;
    PS_LOG(WARNING) << what;
    next_complaint = absl::Now() + absl::Seconds(10);
  };
  for (;;) {
    change_values_.Trim(ParameterShard::kBuffersUnused);  // (while following: Follow does)
    Role role;
    int64_t epoch;
    bool lone_primary;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), kTick)) return;
      role = role_;
      epoch = epoch_;
      lone_primary = role_ == Role::kPrimary && !alone_ && !log_.attached();
      if (role_ == Role::kBackup && !follow_context_) TakeOverLocked("the primary is gone");
      if (role_ != role) continue;
    }
    if (role == Role::kFenced || (role == Role::kPrimary && !lone_primary)) continue;
    v1::ReplicaStatusResponse peer;
    const grpc::Status probed = ProbePeer(false, &peer);
    const bool reached = probed.ok();
    if (probed.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
        probed.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      complain(absl::StrCat("shard ", shard_->index(), ": the replica at ", options_.peer,
                            " refuses this one's replication credential (", probed.error_message(),
                            "); both replicas need the same --replication_token_file"));
    }
    if (role == Role::kPrimary) {  // without a backup: was it replaced?
      if (reached && peer.role() == "primary" && peer.epoch() > epoch) {
        absl::MutexLock lock(&mu_);
        FenceLocked(absl::StrCat("shard ", shard_->index(), ": the replica at ", options_.peer,
                                 " took over as primary at epoch ", peer.epoch(),
                                 " (this process had epoch ", epoch,
                                 "); this one is fenced and acknowledges nothing"));
      } else {
        complain(absl::StrCat("shard ", shard_->index(), ": waiting for a backup to join from ",
                              options_.peer, "; no push is acknowledged meanwhile"));
      }
      continue;
    }
    // Joining, or a backup whose stream ended.
    if (reached && peer.role() == "primary") {
      // At our epoch, only the primary we followed: another process there lacks our state. At an
      // older one, the join (carrying our epoch) fences it.
      bool joinable;
      {
        absl::MutexLock lock(&mu_);
        joinable = peer.epoch() != epoch_ || !caught_up_ || peer.shard_incarnation() == followed_;
      }
      if (!joinable) {
        complain(absl::StrCat("shard ", shard_->index(), ": not joining the primary at ",
                              options_.peer, " (epoch ", peer.epoch(),
                              "): it is not the one this backup followed, whose state it holds"));
        continue;
      }
      if (absl::Status s = Follow(peer); !s.ok() && this->role() != Role::kPrimary) {
        complain(absl::StrCat("shard ", shard_->index(), ": following the primary at ",
                              options_.peer, " ended: ", s.message()));
      }
      continue;
    }
    if (role == Role::kBackup) continue;  // takes over once the silence is long enough
    if (reached && peer.role() == "backup" && peer.caught_up()) {
      // Its primary is gone, or soon will be: have it take over, then join it.
      ProbePeer(true, &peer).IgnoreError();
    } else if (options_.replica == 0 && !veteran() && (!reached || peer.role() == "joining")) {
      absl::MutexLock lock(&mu_);
      if (SetEpochLocked(epoch_ + 1)) {
        role_ = Role::kPrimary;
        PS_LOG(INFO) << "no primary to join at " << options_.peer << ": serving as the primary of "
                     << "shard " << shard_->index() << " at epoch " << epoch_
                     << "; pushes are acknowledged once a backup follows";
      }
    } else {
      complain(absl::StrCat("shard ", shard_->index(), ": waiting for a primary at ", options_.peer,
                            veteran() ? " (this replica took part before, so it starts none "
                                        "itself; if the whole shard starts over, remove its "
                                        "--epoch_file)"
                                      : ""));
    }
  }
}

absl::Status Replica::Follow(const v1::ReplicaStatusResponse& peer) {
  grpc::ClientContext context;
  if (!options_.security.token.empty()) {
    context.AddMetadata(kAuthorizationMetadata, BearerValue(options_.security.token));
  }
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("stopping");
    follow_context_ = &context;
    transferring_ = true;
    if (peer.shard_incarnation() != followed_) caught_up_ = false;
  }
  absl::Cleanup forget = [&] {
    {
      absl::MutexLock lock(&mu_);
      follow_context_ = nullptr;
      transferring_ = false;
      plane_connection_ = 0;
      stages_connections_.clear();
      stages_.clear();
    }
    if (plane_ != nullptr) {
      plane_->Release(DataPlane::kReplicaPeer);
      for (int i = 0; i < options_.forward_at_once; ++i) {
        plane_->Release(DataPlane::kReplicaStages + i);
      }
    }
  };
  std::unique_ptr<Stream> stream = peer_->Replicate(&context);
  v1::BackupMessage join;
  const ModelIdentity& model = shard_->model();
  join.mutable_model()->set_fingerprint(model.fingerprint);
  join.mutable_model()->set_total_params(model.total_params);
  join.mutable_model()->set_num_shards(model.num_shards);
  join.set_shard_index(shard_->index());
  join.set_epoch(epoch());
  // The changes after the state come on this replica's data plane, and the stages on further
  // connections there.
  auto offer = [&](int owner, v1::AttachDataPlaneResponse* ticket) -> absl::StatusOr<uint64_t> {
    absl::StatusOr<DataPlane::Ticket> issued = plane_->Issue(owner);
    if (!issued.ok()) return issued.status();
    ticket->set_port(plane_->port());
    ticket->set_connection(issued->connection);
    ticket->set_secret(issued->secret);
    ticket->set_lanes(issued->lanes);
    ticket->set_calls(true);
    return issued->connection;
  };
  uint64_t plane_connection = 0;
  std::vector<uint64_t> stages_connections;
  if (plane_ != nullptr) {
    absl::StatusOr<uint64_t> changes = offer(DataPlane::kReplicaPeer, join.mutable_data_plane());
    if (!changes.ok()) {
      join.clear_data_plane();
      PS_LOG(WARNING) << "shard " << shard_->index() << ": the primary's changes come on the "
                      << "replication stream: " << changes.status().message();
    } else {
      plane_connection = *changes;
      for (int i = 0; i < options_.forward_at_once; ++i) {
        v1::AttachDataPlaneResponse ticket;
        absl::StatusOr<uint64_t> stages = offer(DataPlane::kReplicaStages + i, &ticket);
        if (!stages.ok()) break;  // (then fewer stages at once)
        stages_connections.push_back(*stages);
        *join.add_stages() = std::move(ticket);
      }
    }
  }
  v1::ReplicationMessage m;
  absl::Status status;
  absl::StatusOr<std::optional<ShardState>> state =
      absl::UnavailableError("the primary refused the join");
  if (stream->Write(join) && stream->Read(&m)) state = ReceiveState(m, stream.get());
  status = state.status();
  const int64_t joined_epoch = m.epoch();
  if (status.ok()) {
    // The new state and role together, and only if this replica did not take over (or stop)
    // meanwhile: what it acknowledged as primary must not be overwritten.
    absl::MutexLock lock(&mu_);
    transferring_ = false;
    if (stopping_ || role_ == Role::kPrimary || role_ == Role::kFenced) {
      status = absl::CancelledError("no longer following");
    } else if (!SetEpochLocked(joined_epoch)) {
      status = absl::UnavailableError("cannot keep the epoch");
    } else if (state->has_value()) {
      status = shard_->Restore(**state);  // lock order: ours, then the shard's
    }
    if (status.ok()) {
      role_ = Role::kBackup;
      caught_up_ = true;
      followed_ = peer.shard_incarnation();
      last_heard_ = absl::Now();
      plane_connection_ = plane_connection;
      stages_connections_ = stages_connections;
      stages_.clear();
    }
  }
  if (status.ok()) {
    PS_LOG(INFO) << "following the primary at " << options_.peer << " (epoch " << joined_epoch
                 << ") from version " << shard_->version();
  }
  std::vector<float> values;
  v1::BackupMessage ack;
  ack.set_applied(m.state().changes());
  while (status.ok() && stream->Write(ack) && stream->Read(&m)) {
    {
      absl::MutexLock lock(&mu_);
      if (role_ != Role::kBackup) break;  // took over: the old primary gets no more acks
      last_heard_ = absl::Now();
    }
    change_values_.Trim(ParameterShard::kBuffersUnused);  // (the stream: a message every 100 ms)
    if (m.epoch() != joined_epoch) {
      status = absl::DataLossError("the primary's epoch changed within its stream");
    } else if (m.has_change()) {
      absl::StatusOr<ShardChange> change = ChangeOf(m.change(), shard_->range().size());
      status = change.status();
      if (status.ok()) {
        values.resize(m.change().length());
        status = ReadValues(Next(stream.get()), joined_epoch, absl::MakeSpan(values));
      }
      if (status.ok()) {
        change->values = values;
        status = shard_->ApplyChange(*change);
      }
      ack.set_applied(m.change().index());
    }
  }
  context.TryCancel();
  stream->Finish().IgnoreError();
  return status.ok() ? absl::UnavailableError("the stream ended") : status;
}

DataPlane::CallAnswer Replica::OnPlaneChange(const DataPlane::Call& call,
                                             DataPlane::ReadValues read_values) {
  auto refuse = [](grpc::StatusCode code, std::string why) {
    return DataPlane::CallAnswer{grpc::Status(code, std::move(why)), ""};
  };
  if (!DataPlane::ReplicaOwner(call.owner)) {
    return refuse(grpc::StatusCode::PERMISSION_DENIED, "only a replica's primary makes changes");
  }
  v1::ReplicationMessage m;
  if (!m.ParseFromString(call.request) || (!m.has_change() && !m.has_stage())) {
    return refuse(grpc::StatusCode::DATA_LOSS, "a change call that does not parse");
  }
  {
    absl::MutexLock lock(&mu_);
    if (grpc::Status s = FromFollowedLocked(call, m); !s.ok()) return {s, ""};
    last_heard_ = absl::Now();
  }
  if (m.has_stage()) return {OnPlaneStage(call, m, read_values), ""};
  absl::StatusOr<ShardChange> change = ChangeOf(m.change(), shard_->range().size());
  if (!change.ok()) return {ToGrpcStatus(change.status()), ""};
  std::optional<BufferPool::Lease> read;  // the values, unless a stage holds them
  std::map<int64_t, BufferPool::Lease>::node_type staged;
  if (const int64_t stage = m.change().staged(); stage != 0) {
    absl::MutexLock lock(&mu_);
    if (grpc::Status s = FromFollowedLocked(call, m); !s.ok()) return {s, ""};
    auto it = stages_.find(stage);
    if (it == stages_.end() ||
        static_cast<int64_t>(it->second.span().size()) != m.change().length()) {
      return refuse(grpc::StatusCode::FAILED_PRECONDITION,
                    absl::StrCat("change ", m.change().index(), " names stage ", stage,
                                 ", which this backup does not hold"));
    }
    staged = stages_.extract(it);
    change->values = staged.mapped().span();
  } else {
    read.emplace(change_values_.Acquire(m.change().length()));
    // Each run of values that comes counts as hearing from the primary, as each chunk on the
    // stream does (a large change on a slow link takes longer than the failover time).
    absl::Status status = read_values(
        read->span(), WireType::kFloat32,
        [&](absl::Span<const float>) {
          absl::MutexLock lock(&mu_);
          last_heard_ = absl::Now();
        },
        ValuesOrder::kInOrder);
    if (!status.ok()) return {ToGrpcStatus(status), ""};
    change->values = read->span();
  }
  // Applied only if this replica still follows that primary (it may have taken over meanwhile),
  // under the replica's lock so that it cannot take over during the apply (lock order: ours,
  // then the shard's).
  absl::MutexLock lock(&mu_);
  if (grpc::Status s = FromFollowedLocked(call, m); !s.ok()) return {s, ""};
  return {ToGrpcStatus(shard_->ApplyChange(*change)), ""};
}

grpc::Status Replica::FromFollowedLocked(const DataPlane::Call& call,
                                         const v1::ReplicationMessage& m) const {
  const int64_t stages = static_cast<int64_t>(call.owner) - DataPlane::kReplicaStages;
  const bool on_its_connection =
      m.has_stage() ? stages >= 0 && stages < static_cast<int64_t>(stages_connections_.size()) &&
                          call.connection == stages_connections_[stages]
                    : call.owner == DataPlane::kReplicaPeer && call.connection == plane_connection_;
  if (on_its_connection && role_ == Role::kBackup && !transferring_ && m.epoch() == epoch_) {
    return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                      absl::StrCat("shard ", shard_->index(), ": this replica (", RoleName(role_),
                                   ", epoch ", epoch_, ") does not follow a primary at epoch ",
                                   m.epoch(), " on this connection"));
}

grpc::Status Replica::OnPlaneStage(const DataPlane::Call& call, const v1::ReplicationMessage& m,
                                   DataPlane::ReadValues read_values) {
  const v1::Stage& stage = m.stage();
  {
    absl::MutexLock lock(&mu_);
    if (grpc::Status s = FromFollowedLocked(call, m); !s.ok()) return s;
    for (int64_t id : stage.drop()) stages_.erase(id);
    if (stage.length() < 0 || stage.length() > shard_->range().size()) {
      return grpc::Status(grpc::StatusCode::DATA_LOSS, "a stage longer than the shard");
    }
    const int room = StageRoom(options_.forward_at_once);
    if (stages_.size() + stages_arriving_ >= static_cast<size_t>(room)) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("this backup holds ", room, " stages already"));
    }
    ++stages_arriving_;
  }
  BufferPool::Lease values = change_values_.Acquire(stage.length());
  absl::Status status = read_values(
      values.span(), WireType::kFloat32,
      [&](absl::Span<const float>) {
        absl::MutexLock lock(&mu_);
        last_heard_ = absl::Now();
      },
      ValuesOrder::kInOrder);
  absl::MutexLock lock(&mu_);
  --stages_arriving_;
  if (!status.ok()) return ToGrpcStatus(status);
  if (grpc::Status s = FromFollowedLocked(call, m); !s.ok()) return s;  // no longer
  stages_.emplace(stage.id(), std::move(values));
  return grpc::Status::OK;
}

std::unique_ptr<Replica::Forward> Replica::StartForward(absl::Span<const float> buffer) {
  if (buffer.size() * sizeof(float) < kMinForwardBytes) return nullptr;
  std::shared_ptr<DataConnection> plane;
  v1::ReplicationMessage m;
  std::unique_ptr<Forward> forward;
  {
    absl::MutexLock lock(&forward_mu_);
    std::vector<bool> free(forward_planes_.size(), true);
    for (const std::shared_ptr<DataConnection>& p : forward_planes_) {
      if (p->ended()) return nullptr;  // a stage failed: none until a backup joins again
    }
    for (const auto& [id, staged] : staged_) {
      if (staged.state == StageState::kSending) free[staged.plane] = false;
    }
    const auto first_free = std::find(free.begin(), free.end(), true);
    if (first_free == free.end()) return nullptr;
    // What the backup may hold once this stage's drops are done there (the drops of a stage
    // still being sent count: this one may come before it).
    const size_t room = StageRoom(static_cast<int>(forward_planes_.size()));
    if (staged_.size() - drops_.size() >= room) return nullptr;
    const int index = static_cast<int>(first_free - free.begin());
    plane = forward_planes_[index];
    m.set_epoch(forward_epoch_);
    v1::Stage* stage = m.mutable_stage();
    stage->set_id(next_stage_++);
    stage->set_length(static_cast<int64_t>(buffer.size()));
    for (int64_t id : drops_) {
      stage->add_drop(id);
      staged_[id].state = StageState::kDropping;
    }
    drops_.clear();
    staged_[stage->id()] = {StageState::kSending, index};
    forward.reset(new Forward(this, stage->id(), buffer));
  }
  Forward* f = forward.get();
  const std::vector<int64_t> dropped(m.stage().drop().begin(), m.stage().drop().end());
  auto send = [this, f, plane, m = std::move(m), buffer, dropped] {
    absl::StatusOr<DataConnection::Answered> answered =
        plane->PushCall(plane->NextTransfer(), m.SerializeAsString(), buffer, WireType::kFloat32,
                        absl::Now() + kStageTimeout, FrameKind::kChangeCall, &f->progress_);
    const absl::Status status =
        answered.ok() ? FromGrpcStatus(answered->status) : answered.status();
    absl::MutexLock lock(&forward_mu_);
    auto it = staged_.find(f->id_);
    if (it == staged_.end()) return;  // forwarded to an earlier backup
    for (int64_t id : dropped) staged_.erase(id);  // (or given up with the connections below)
    if (status.ok()) {
      it->second.state = StageState::kHeld;
      f->held_ = true;
      return;
    }
    // Whether the backup holds it is not known (an answer that did not come): every stage
    // connection is given up (stages held are still named; those no change names stay on the
    // backup until it joins again, StageRoom at most).
    staged_.erase(it);
    if (std::any_of(forward_planes_.begin(), forward_planes_.end(),
                    [](const auto& p) { return !p->ended(); })) {  // (else said already)
      PS_LOG(WARNING) << "shard " << shard_->index() << ": the backup did not take a forwarded "
                      << "push (" << status.message() << "); pushes are replicated once "
                      << "applied until a backup joins again";
    }
    for (const std::shared_ptr<DataConnection>& p : forward_planes_) p->End();
  };
  try {
    f->thread_ = std::thread(std::move(send));
  } catch (const std::system_error&) {  // no thread: as if not forwarded
    absl::MutexLock lock(&forward_mu_);
    staged_.erase(f->id_);
    for (int64_t id : dropped) {  // still held there, to drop with the next stage
      auto it = staged_.find(id);
      if (it == staged_.end()) continue;  // forgotten with that backup meanwhile
      it->second.state = StageState::kHeld;
      drops_.push_back(id);
    }
    return nullptr;
  }
  return forward;
}

void Replica::Forward::Seen(absl::Span<const float> run) {
  const int64_t offset = run.data() - buffer_.data();
  absl::MutexLock lock(&mu_);
  if (offset != prefix_) {
    ahead_.emplace(offset, offset + static_cast<int64_t>(run.size()));
    return;
  }
  const int64_t before = prefix_;
  prefix_ += static_cast<int64_t>(run.size());
  for (auto it = ahead_.begin(); it != ahead_.end() && it->first == prefix_;) {
    prefix_ = it->second;
    it = ahead_.erase(it);
  }
  progress_.Add(prefix_ - before);
}

int64_t Replica::Forward::Finish() {
  if (thread_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      whole_ = prefix_ == progress_.total();
      progress_.Add(progress_.total() - prefix_);  // what did not come goes as it is
    }
    thread_.join();
  }
  return held_ && whole_ ? id_ : 0;
}

Replica::Forward::~Forward() {
  Finish();
  if (!held_ || named_) return;  // (one not whole is never named)
  absl::MutexLock lock(&replica_->forward_mu_);
  if (replica_->staged_.count(id_) != 0) replica_->drops_.push_back(id_);
}

void Replica::ForwardTo(std::vector<std::shared_ptr<DataConnection>> planes, int64_t epoch,
                        int64_t attachment) {
  absl::MutexLock lock(&forward_mu_);
  if (attachment < forward_attachment_) return;  // an older backup's that ended late
  forward_planes_ = std::move(planes);
  forward_epoch_ = epoch;
  forward_attachment_ = attachment;
  staged_.clear();
  drops_.clear();
}

void Replica::StopForwarding(int64_t attachment) {
  absl::MutexLock lock(&forward_mu_);
  if (attachment != forward_attachment_) return;  // another backup's
  forward_planes_.clear();
  staged_.clear();
  drops_.clear();
}

void Replica::OnChange(const ShardChange& change) {
  // A change that names a stage its backup holds is sent without values (NameStage), so they
  // need not be kept: it stays held until then (only ForwardTo forgets it, once that backup's
  // attachment, and with it this change, is gone).
  log_.Append(change, [&](int64_t attachment) {
    absl::MutexLock lock(&forward_mu_);
    auto it = staged_.find(change.stage);
    return attachment == forward_attachment_ && it != staged_.end() &&
           it->second.state == StageState::kHeld;
  });
}

bool Replica::NameStage(int64_t stage, int64_t attachment) {
  absl::MutexLock lock(&forward_mu_);
  auto it = staged_.find(stage);
  if (attachment != forward_attachment_ || it == staged_.end() ||
      it->second.state != StageState::kHeld) {
    return false;
  }
  it->second.state = StageState::kNamed;
  return true;
}

void Replica::StageUsed(int64_t stage, bool applied) {
  absl::MutexLock lock(&forward_mu_);
  staged_.erase(stage);
  changes_forwarded_ += applied;
}

int64_t Replica::changes_forwarded() const {
  absl::MutexLock lock(&forward_mu_);
  return changes_forwarded_;
}

int Replica::stages_sending() const {
  absl::MutexLock lock(&forward_mu_);
  return static_cast<int>(std::count_if(staged_.begin(), staged_.end(), [](const auto& s) {
    return s.second.state == StageState::kSending;
  }));
}

std::shared_ptr<DataConnection> Replica::OpenBackupPlane(const v1::AttachDataPlaneResponse& ticket,
                                                         absl::string_view otherwise) {
  std::string host, port;
  absl::StatusOr<std::unique_ptr<DataConnection>> plane =
      !SplitHostPort(options_.peer, &host, &port)
          ? absl::InvalidArgumentError(absl::StrCat("no host in --peer=", options_.peer))
          : DataConnection::Open(
                {host, ticket.port(), ticket.connection(), ticket.secret(),
                 std::max(ticket.lanes(), 1), ticket.calls(), options_.security.plane_tls},
                static_cast<uint64_t>(shard_->range().size()) * sizeof(float),
                absl::Now() + absl::Seconds(5), absl::Seconds(10));
  if (!plane.ok()) {
    PS_LOG(WARNING) << "shard " << shard_->index() << ": the backup's data plane cannot be used ("
                    << plane.status().message() << "); " << otherwise;
    return nullptr;
  }
  return *std::move(plane);
}

bool Replica::SendOnPlane(DataConnection& plane, const v1::ReplicationMessage& change,
                          absl::Span<const float> values, int64_t attachment) {
  absl::StatusOr<DataConnection::Answered> answered =
      plane.PushCall(plane.NextTransfer(), change.SerializeAsString(), values, WireType::kFloat32,
                     absl::Now() + kChangeTimeout, FrameKind::kChangeCall);
  const absl::Status status = answered.ok() ? FromGrpcStatus(answered->status) : answered.status();
  if (!status.ok()) {
    PS_LOG(WARNING) << "shard " << shard_->index() << ": the backup did not take change "
                    << change.change().index() << " on its data plane (" << status.message() << ")";
    return false;
  }
  log_.Acknowledge(attachment, change.change().index());
  return true;
}

std::function<bool(v1::ReplicationMessage*)> Replica::Next(Stream* stream) {
  return [this, stream](v1::ReplicationMessage* m) {
    if (!stream->Read(m)) return false;
    absl::MutexLock lock(&mu_);
    last_heard_ = absl::Now();
    return true;
  };
}

absl::StatusOr<std::optional<ShardState>> Replica::ReceiveState(const v1::ReplicationMessage& first,
                                                                Stream* stream) {
  if (first.epoch() < epoch()) {
    return absl::FailedPreconditionError(absl::StrCat("the primary is at epoch ", first.epoch(),
                                                      ", older than this replica's ", epoch()));
  }
  // A backup takes over with its own settings: they must be its primary's, or a failover would
  // change the job's rules (Restore checks the rest of the state: model, optimizer, sizes).
  if (first.has_state() && first.state().consistency() != shard_->consistency().Name()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the primary runs --consistency=", first.state().consistency(), ", this backup ",
        shard_->consistency().Name(), ": give both replicas of a shard the same settings"));
  }
  absl::StatusOr<ShardState> state = ReadState(first, shard_->range().size(), Next(stream));
  if (!state.ok()) return state.status();
  if (!state->has_model()) {
    if (shard_->initialized()) {
      return absl::FailedPreconditionError(
          "the primary holds no model while this replica holds one: not replacing it");
    }
    return std::nullopt;
  }
  return std::optional<ShardState>(*std::move(state));
}

grpc::Status Replica::ServeBackup(grpc::ServerContext* context, BackupStream* stream) {
  v1::BackupMessage join;
  if (!stream->Read(&join)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no join message");
  }
  const ModelIdentity& model = shard_->model();
  if (join.model().fingerprint() != model.fingerprint ||
      join.model().total_params() != model.total_params ||
      join.model().num_shards() != model.num_shards || join.shard_index() != shard_->index()) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("a backup of shard ", join.shard_index(), " of ", join.model().fingerprint(),
                     " cannot follow shard ", shard_->index(), " of ", model.fingerprint));
  }
  int64_t epoch;
  {
    absl::MutexLock lock(&mu_);
    if (join.epoch() > epoch_) {
      FenceLocked(absl::StrCat("shard ", shard_->index(), ": a backup knows epoch ", join.epoch(),
                               ", newer than this primary's ", epoch_,
                               "; this one is fenced and acknowledges nothing"));
    }
    if (role_ != Role::kPrimary) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("this replica is ", RoleName(role_), ", not the primary"));
    }
    epoch = epoch_;
  }
  const int64_t attachment = log_.Attach();
  if (attachment == 0) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "shutting down");
  {
    absl::MutexLock lock(&mu_);
    alone_ = false;  // from now on every change waits for this backup
  }
  PS_LOG(INFO) << "a backup is joining from " << context->peer() << ": sending the state";
  // The changes after the state go on the backup's data plane if it can be reached, and stages
  // on connections of their own there.
  const std::shared_ptr<DataConnection> plane =
      join.has_data_plane()
          ? OpenBackupPlane(join.data_plane(), "its changes go on the replication stream")
          : nullptr;
  std::vector<std::shared_ptr<DataConnection>> stages;
  for (int i = 0; plane != nullptr && options_.forward && i < join.stages_size() &&
                  i < DataPlane::kMaxReplicaStageConnections;
       ++i) {
    std::shared_ptr<DataConnection> opened =
        OpenBackupPlane(join.stages(i), "stages go on the others only (none: not forwarded)");
    if (opened != nullptr) stages.push_back(std::move(opened));
  }
  // The acknowledgements, read beside the changes written below; the stream's end ends a change
  // made on the data plane too. The backup's first comes once its state is in place: no change
  // goes on its data plane before (it would wait there, unread, while the state still comes).
  absl::Notification state_in_place;
  std::thread acks([&] {
    v1::BackupMessage ack;
    while (stream->Read(&ack)) {
      log_.Acknowledge(attachment, ack.applied());
      if (!state_in_place.HasBeenNotified()) state_in_place.Notify();
    }
    log_.Detach(attachment);
    if (plane != nullptr) plane->End();
    for (const std::shared_ptr<DataConnection>& s : stages) s->End();
    if (!state_in_place.HasBeenNotified()) state_in_place.Notify();
  });
  absl::Cleanup stop_acks = [&] {
    StopForwarding(attachment);
    log_.Detach(attachment);
    context->TryCancel();
    acks.join();
  };
  auto owned_state = std::make_shared<ShardState>();
  // Without a model yet, the header alone: the backup then waits for the initialisation change.
  shard_->Checkpoint(owned_state.get()).IgnoreError();
  int64_t sent = owned_state->header.changes();
  log_.Start(attachment, sent);
  auto write = [stream](grpc::ByteBuffer bytes) { return stream->Write(bytes); };
  bool ok = WriteState(*owned_state, epoch, owned_state, write);
  owned_state.reset();  // freed once gRPC is done with it
  if (ok) {
    PS_LOG(INFO) << "a backup joined at change " << sent << ": "
                 << (plane != nullptr ? "making changes on its data plane" : "streaming changes");
  }
  if (ok && !stages.empty()) {
    state_in_place.WaitForNotification();  // ends with the stream at the latest
    ForwardTo(stages, epoch, attachment);  // (none go if the stream ended: they ended with it)
  }
  while (ok) {
    absl::StatusOr<std::optional<std::shared_ptr<const ReplicationLog::Entry>>> next =
        log_.Next(attachment, sent, kHeartbeat);
    if (!next.ok()) break;
    v1::ReplicationMessage out;
    out.set_epoch(epoch);
    if (!next->has_value()) {  // idle: a heartbeat
      ok = WriteMessage(out, write);
      continue;
    }
    const ShardChange& c = (**next)->change;
    v1::ChangeHeader* header = out.mutable_change();
    header->set_index(c.index);
    header->set_kind(ToProto(c.kind));
    header->set_drop(ToProto(c.drop));
    header->set_version(c.version);
    header->set_worker_id(c.worker_id);
    header->set_sequence(c.sequence);
    header->set_clock(c.clock);
    header->set_staleness(c.staleness);
    header->set_learning_rate(c.learning_rate);
    header->set_length((**next)->length);
    if (plane != nullptr) {
      state_in_place.WaitForNotification();  // ends with the stream at the latest
      const bool staged = c.stage != 0 && NameStage(c.stage, attachment);
      if (staged) header->set_staged(c.stage);
      if (!staged && static_cast<int64_t>(c.values.size()) != (**next)->length) {
        PS_LOG(ERROR) << "shard " << shard_->index() << ": change " << c.index << " names stage "
                      << c.stage << ", which the backup no longer holds; it joins again";
        break;
      }
      ok = SendOnPlane(*plane, out, staged ? absl::Span<const float>() : c.values, attachment);
      if (staged) StageUsed(c.stage, ok);
    } else {
      ok = WriteMessage(out, write) && WriteValues(c.values, epoch, **next, write);
    }
    sent = c.index;
  }
  PS_LOG(WARNING) << "the backup at " << context->peer() << " went away"
                  << "; no push is acknowledged until a backup joins";
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* ReplicationService::Status(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // The caller first: a stranger's bytes are never parsed.
  grpc::Status status = AuthorizeCall(tokens_, *context, Access::kReplicate, "Replication/Status");
  v1::ReplicaStatusRequest parsed;
  if (status.ok() && !ParseRaw(*request, &parsed)) {
    status =
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "cannot parse Replication/Status request");
  }
  if (status.ok()) {
    grpc::Slice slice(replica_->Status(parsed.take_over()).SerializeAsString());
    *response = grpc::ByteBuffer(&slice, 1);
  }
  reactor->Finish(status);
  return reactor;
}

ReplicationService::ReplicationService(Replica* replica, TokenAuthenticator tokens)
    : replica_(replica), tokens_(std::move(tokens)) {
  MarkMethodStreamed(
      MethodIndex<v1::Replication>("Replicate"),
      new grpc::internal::BidiStreamingHandler<ReplicationService, v1::BackupMessage,
                                               grpc::ByteBuffer>(
          [](ReplicationService* s, grpc::ServerContext* context, Replica::BackupStream* stream) {
            return s->Replicate(context, stream);
          },
          this));
}

grpc::Status ReplicationService::Replicate(grpc::ServerContext* context,
                                           Replica::BackupStream* stream) {
  if (grpc::Status s = AuthorizeCall(tokens_, *context, Access::kReplicate, "Replicate"); !s.ok()) {
    return s;
  }
  return replica_->ServeBackup(context, stream);
}

}  // namespace ps
