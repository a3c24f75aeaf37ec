#include "server/replication/replica.h"

#include <grpcpp/create_channel.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/cluster.h"
#include "common/log.h"
#include "common/version.h"
#include "server/replication/epoch_file.h"
#include "server/replication/state_transfer.h"
#include "transport/grpc_status.h"
#include "transport/tensor_codec.h"

namespace ps {
namespace {

constexpr absl::Duration kHeartbeat = absl::Milliseconds(100);  // primary to backup, when idle
constexpr absl::Duration kTick = absl::Milliseconds(100);       // the role thread's pace
constexpr absl::Duration kProbeTimeout = absl::Milliseconds(500);
// The stall limit of a stage connection, past kMaxFillWait (30 s): its frames come as the push
// they forward arrives at the primary, which waits up to that for each piece (past a worker's
// `stall`, after which that push fails and the primary sends the rest of the stage as it is).
constexpr absl::Duration kStagesStall = absl::Seconds(40);

// The role thread's warnings, at most every 10 s: roles take a few ticks to settle at start, so
// nothing is worth one before 5 s.
class Complaints {
 public:
  void operator()(const std::string& what) {
    if (absl::Now() < next_) return;
    PS_LOG(WARNING) << what;
    next_ = absl::Now() + absl::Seconds(10);
  }

 private:
  absl::Time next_ = absl::Now() + absl::Seconds(5);
};

RoleMachine::Peer PeerOf(const grpc::Status& probed, const v1::ReplicaStatusResponse& status) {
  if (!probed.ok()) return RoleMachine::Peer();
  return {true, RoleMachine::RoleNamed(status.role()), status.epoch(), status.shard_incarnation(),
          status.caught_up()};
}

}  // namespace

std::vector<DataPlane::OwnerKind> Replica::PlaneOwners() {
  constexpr char kWho[] = "the replica's primary", kReleased[] = "the backup stopped following";
  return {{kPeerOwner, 1, kWho, absl::ZeroDuration(), kReleased},
          {kStagesOwner, kMaxStageConnections, kWho, kStagesStall, kReleased}};
}

Replica::Replica(ParameterShard* shard, int64_t shard_incarnation, Options options,
                 DataPlane* plane)
    : shard_(shard),
      shard_incarnation_(shard_incarnation),
      options_(std::move(options)),
      plane_(plane),
      change_values_(StageForwarder::StageRoom(options_.forward_at_once) + 1),
      forwarder_(shard->index()),
      machine_({shard->index(), options_.peer, options_.replica, options_.failover},
               [file = options_.epoch_file](int64_t epoch) {
                 return file.empty() ? absl::OkStatus() : WriteEpochFile(file, epoch);
               }) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = options_.security.credentials;
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
  peer_ = v1::Replication::NewStub(grpc::CreateCustomChannel(options_.peer, credentials, args));
}

Replica::~Replica() { Stop(); }

absl::Status Replica::CheckOptions(const Options& options) {
  if (options.forward_at_once < 1 || options.forward_at_once > kMaxStageConnections) {
    return absl::InvalidArgumentError(
        absl::StrCat("--forward_at_once must be 1 to ", kMaxStageConnections));
  }
  return absl::OkStatus();
}

absl::Status Replica::Start() {
  if (absl::Status s = CheckOptions(options_); !s.ok()) return s;
  if (!options_.epoch_file.empty()) {
    absl::StatusOr<int64_t> epoch = ReadEpochFile(options_.epoch_file);
    if (!epoch.ok()) return epoch.status();
    absl::MutexLock lock(&mu_);
    machine_.Resume(*epoch);
    if (machine_.veteran()) {
      PS_LOG(INFO) << "this replica took part in the job up to epoch " << *epoch << " ("
                   << options_.epoch_file << "): it joins its peer, and starts no primary itself";
    }
  }
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
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
  return machine_.epoch();
}

std::string Replica::fenced_reason() const {
  absl::MutexLock lock(&mu_);
  return machine_.fenced_reason();
}

bool Replica::TakeOverLocked(absl::string_view why) {
  const absl::Time now = absl::Now();
  if (!machine_.TakeOver(now)) return false;
  stages_.clear();  // no change will name them
  if (follow_context_ != nullptr) follow_context_->TryCancel();
  PS_LOG(WARNING) << "took over as the primary of shard " << shard_->index() << " at epoch "
                  << machine_.epoch() << " (" << why << "; the primary at " << options_.peer
                  << " was last heard from " << absl::FormatDuration(machine_.silence(now))
                  << " ago), at version " << shard_->version()
                  << "; serving alone until a backup joins";
  return true;
}

void Replica::FencedLocked() {
  log_.Close();
  PS_LOG(ERROR) << machine_.fenced_reason();
}

absl::Status Replica::CheckServing(bool may_take_over) {
  absl::MutexLock lock(&mu_);
  if (may_take_over && machine_.role() == Role::kBackup) {
    TakeOverLocked("a client found the primary gone");
  }
  return machine_.Serving(log_.attached(), absl::Now());
}

absl::Status Replica::WaitReplicated(absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    const Role role = machine_.role();
    if (role == Role::kPrimary && machine_.alone()) return absl::OkStatus();
    if (role != Role::kPrimary) {
      return absl::UnavailableError(absl::StrCat("shard ", shard_->index(), ": this replica is ",
                                                 RoleMachine::RoleName(role),
                                                 " now; not acknowledged"));
    }
  }
  return log_.WaitReplicated(deadline);
}

v1::ReplicaStatusResponse Replica::Status(bool take_over) {
  absl::MutexLock lock(&mu_);
  if (take_over) TakeOverLocked("its peer asked, finding no primary");
  const Role role = machine_.role();
  v1::ReplicaStatusResponse r;
  r.set_shard_index(shard_->index());
  r.set_role(RoleMachine::RoleName(role));
  r.set_epoch(machine_.epoch());
  r.set_shard_incarnation(shard_incarnation_);
  if (role == Role::kBackup) {
    r.set_seconds_since_primary(absl::ToDoubleSeconds(machine_.silence(absl::Now())));
  }
  r.set_backup_attached(role == Role::kPrimary && log_.attached());
  r.set_caught_up(machine_.caught_up() || role == Role::kPrimary);
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
  Complaints complain;
  for (;;) {
    change_values_.Trim(ParameterShard::kBuffersUnused);  // (while following: Follow does)
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), kTick)) return;
      if (machine_.role() == Role::kBackup && !machine_.following()) {
        TakeOverLocked("the primary is gone");
      }
      if (!machine_.ShouldProbe(log_.attached())) continue;
    }
    v1::ReplicaStatusResponse peer;
    const grpc::Status probed = ProbePeer(false, &peer);
    if (probed.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
        probed.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      complain(absl::StrCat("shard ", shard_->index(), ": the replica at ", options_.peer,
                            " refuses this one's replication credential (", probed.error_message(),
                            "); both replicas need the same --replication_token_file"));
    }
    RoleMachine::Action action;
    {
      absl::MutexLock lock(&mu_);
      action = machine_.Next(PeerOf(probed, peer), log_.attached());
      if (action == RoleMachine::Action::kFenced) FencedLocked();
      if (action == RoleMachine::Action::kStartedPrimary) {
        PS_LOG(INFO) << "no primary to join at " << options_.peer << ": serving as the primary of "
                     << "shard " << shard_->index() << " at epoch " << machine_.epoch()
                     << "; pushes are acknowledged once a backup follows";
      }
    }
    Act(action, peer, [&](const std::string& what) { complain(what); });
  }
}

void Replica::Act(RoleMachine::Action action, v1::ReplicaStatusResponse& peer, Complain complain) {
  const std::string shard = absl::StrCat("shard ", shard_->index());
  switch (action) {
    case RoleMachine::Action::kWaitForBackup:
      complain(absl::StrCat(shard, ": waiting for a backup to join from ", options_.peer,
                            "; no push is acknowledged meanwhile"));
      return;
    case RoleMachine::Action::kNotTheFollowed:
      complain(absl::StrCat(shard, ": not joining the primary at ", options_.peer, " (epoch ",
                            peer.epoch(),
                            "): it is not the one this backup followed, whose state it holds"));
      return;
    case RoleMachine::Action::kJoin:
      if (absl::Status s = Follow(peer); !s.ok() && role() != Role::kPrimary) {
        complain(absl::StrCat(shard, ": following the primary at ", options_.peer,
                              " ended: ", s.message()));
      }
      return;
    case RoleMachine::Action::kAskToTakeOver:  // then joins it
      ProbePeer(true, &peer).IgnoreError();
      return;
    case RoleMachine::Action::kWaitForPrimary: {
      bool veteran;
      {
        absl::MutexLock lock(&mu_);
        veteran = machine_.veteran();
      }
      complain(absl::StrCat(shard, ": waiting for a primary at ", options_.peer,
                            veteran ? " (this replica took part before, so it starts none "
                                      "itself; if the whole shard starts over, remove its "
                                      "--epoch_file)"
                                    : ""));
      return;
    }
    default:
      return;
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
    machine_.BeginFollow(peer.shard_incarnation());
  }
  absl::Cleanup forget = [&] {
    {
      absl::MutexLock lock(&mu_);
      follow_context_ = nullptr;
      machine_.EndFollow();
      plane_connection_ = 0;
      stages_connections_.clear();
      stages_.clear();
    }
    if (plane_ != nullptr) {
      plane_->Release(kPeerOwner);
      for (int i = 0; i < options_.forward_at_once; ++i) {
        plane_->Release(kStagesOwner + i);
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
  StampRelease(&join);
  const Tickets tickets = OfferTickets(&join);
  v1::ReplicationMessage m;
  absl::StatusOr<std::optional<ShardState>> state =
      absl::UnavailableError("the primary refused the join");
  if (stream->Write(join) && stream->Read(&m)) state = ReceiveState(m, stream.get());
  absl::Status status = state.status();
  const int64_t joined_epoch = m.epoch();
  if (status.ok()) {
    status = PutStateInPlace(*state, joined_epoch, peer.shard_incarnation(), tickets);
  }
  if (status.ok()) {
    PS_LOG(INFO) << "following the primary at " << options_.peer << " (epoch " << joined_epoch
                 << ") from version " << shard_->version();
    status = ApplyChanges(stream.get(), joined_epoch, m.state().changes());
  }
  context.TryCancel();
  stream->Finish().IgnoreError();
  return status.ok() ? absl::UnavailableError("the stream ended") : status;
}

Replica::Tickets Replica::OfferTickets(v1::BackupMessage* join) {
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
  Tickets tickets;
  if (plane_ == nullptr) return tickets;
  absl::StatusOr<uint64_t> changes = offer(kPeerOwner, join->mutable_data_plane());
  if (!changes.ok()) {
    join->clear_data_plane();
    PS_LOG(WARNING) << "shard " << shard_->index() << ": the primary's changes come on the "
                    << "replication stream: " << changes.status().message();
    return tickets;
  }
  tickets.changes = *changes;
  for (int i = 0; i < options_.forward_at_once; ++i) {
    v1::AttachDataPlaneResponse ticket;
    absl::StatusOr<uint64_t> stages = offer(kStagesOwner + i, &ticket);
    if (!stages.ok()) break;  // (then fewer stages at once)
    tickets.stages.push_back(*stages);
    *join->add_stages() = std::move(ticket);
  }
  return tickets;
}

absl::Status Replica::PutStateInPlace(const std::optional<ShardState>& state, int64_t epoch,
                                      int64_t incarnation, const Tickets& tickets) {
  absl::MutexLock lock(&mu_);
  absl::Status status =
      stopping_ ? absl::CancelledError("no longer following") : machine_.AcceptState(epoch);
  if (status.ok() && state.has_value()) {
    status = shard_->Restore(*state);  // lock order: ours, then the shard's
  }
  if (!status.ok()) return status;
  machine_.Followed(incarnation, absl::Now());
  plane_connection_ = tickets.changes;
  stages_connections_ = tickets.stages;
  stages_.clear();
  return absl::OkStatus();
}

absl::Status Replica::ApplyChanges(Stream* stream, int64_t epoch, int64_t applied) {
  std::vector<float> values;
  v1::BackupMessage ack;
  ack.set_applied(applied);
  v1::ReplicationMessage m;
  absl::Status status;
  while (status.ok() && stream->Write(ack) && stream->Read(&m)) {
    {
      absl::MutexLock lock(&mu_);
      if (machine_.role() != Role::kBackup) break;  // took over: the old primary gets no more acks
      machine_.Heard(absl::Now());
    }
    change_values_.Trim(ParameterShard::kBuffersUnused);  // (the stream: a message every 100 ms)
    if (m.epoch() != epoch) {
      status = absl::DataLossError("the primary's epoch changed within its stream");
    } else if (m.has_change()) {
      absl::StatusOr<ShardChange> change = ChangeOf(m.change(), shard_->range().size());
      status = change.status();
      if (status.ok()) {
        values.resize(m.change().length());
        status = ReadValues(Next(stream), epoch, absl::MakeSpan(values));
      }
      if (status.ok()) {
        change->values = values;
        status = shard_->ApplyChange(*change);
      }
      ack.set_applied(m.change().index());
    }
  }
  return status;
}

std::function<bool(v1::ReplicationMessage*)> Replica::Next(Stream* stream) {
  return [this, stream](v1::ReplicationMessage* m) {
    if (!stream->Read(m)) return false;
    absl::MutexLock lock(&mu_);
    machine_.Heard(absl::Now());
    return true;
  };
}

absl::StatusOr<std::optional<ShardState>> Replica::ReceiveState(const v1::ReplicationMessage& first,
                                                                Stream* stream) {
  if (absl::Status s = CheckRelease(first, "primary", "backup"); !s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = machine_.CheckPrimaryEpoch(first.epoch()); !s.ok()) return s;
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

DataPlane::CallAnswer Replica::OnPlaneChange(const DataPlane::Call& call,
                                             DataPlane::ReadValues read_values) {
  auto refuse = [](grpc::StatusCode code, std::string why) {
    return DataPlane::CallAnswer{grpc::Status(code, std::move(why)), ""};
  };
  if (!PlaneOwner(call.owner)) {
    return refuse(grpc::StatusCode::PERMISSION_DENIED, "only a replica's primary makes changes");
  }
  v1::ReplicationMessage m;
  if (!m.ParseFromString(call.request) || (!m.has_change() && !m.has_stage())) {
    return refuse(grpc::StatusCode::DATA_LOSS, "a change call that does not parse");
  }
  {
    absl::MutexLock lock(&mu_);
    if (grpc::Status s = FromFollowedLocked(call, m); !s.ok()) return {s, ""};
    machine_.Heard(absl::Now());
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
    absl::Status status = ReadFromPrimary(read_values, read->span());
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

absl::Status Replica::ReadFromPrimary(DataPlane::ReadValues read_values, absl::Span<float> values) {
  return read_values(
      values, WireType::kFloat32,
      [&](absl::Span<const float>) {
        absl::MutexLock lock(&mu_);
        machine_.Heard(absl::Now());
      },
      ValuesOrder::kInOrder);
}

grpc::Status Replica::FromFollowedLocked(const DataPlane::Call& call,
                                         const v1::ReplicationMessage& m) const {
  const int64_t stages = static_cast<int64_t>(call.owner) - kStagesOwner;
  const bool on_its_connection =
      m.has_stage() ? stages >= 0 && stages < static_cast<int64_t>(stages_connections_.size()) &&
                          call.connection == stages_connections_[stages]
                    : call.owner == kPeerOwner && call.connection == plane_connection_;
  if (on_its_connection && machine_.Follows(m.epoch())) return grpc::Status::OK;
  return grpc::Status(
      grpc::StatusCode::FAILED_PRECONDITION,
      absl::StrCat("shard ", shard_->index(), ": this replica (",
                   RoleMachine::RoleName(machine_.role()), ", epoch ", machine_.epoch(),
                   ") does not follow a primary at epoch ", m.epoch(), " on this connection"));
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
    const int room = StageForwarder::StageRoom(options_.forward_at_once);
    if (stages_.size() + stages_arriving_ >= static_cast<size_t>(room)) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("this backup holds ", room, " stages already"));
    }
    ++stages_arriving_;
  }
  BufferPool::Lease values = change_values_.Acquire(stage.length());
  absl::Status status = ReadFromPrimary(read_values, values.span());
  absl::MutexLock lock(&mu_);
  --stages_arriving_;
  if (!status.ok()) return ToGrpcStatus(status);
  if (grpc::Status s = FromFollowedLocked(call, m); !s.ok()) return s;  // no longer
  stages_.emplace(stage.id(), std::move(values));
  return grpc::Status::OK;
}

void Replica::OnChange(const ShardChange& change) {
  // A change whose stage its backup holds is sent without values (PlaneChangeSink), so they need
  // not be kept: the stage stays held until then (only ForwardTo forgets it, once that backup's
  // attachment, and with it this change, is gone).
  log_.Append(change,
              [&](int64_t attachment) { return forwarder_.Holds(change.forward_tag, attachment); });
}

absl::StatusOr<int64_t> Replica::AcceptJoin(const v1::BackupMessage& join) {
  if (absl::Status s = CheckRelease(join, "backup", "primary"); !s.ok()) return s;
  const ModelIdentity& model = shard_->model();
  if (join.model().fingerprint() != model.fingerprint ||
      join.model().total_params() != model.total_params ||
      join.model().num_shards() != model.num_shards || join.shard_index() != shard_->index()) {
    return absl::FailedPreconditionError(
        absl::StrCat("a backup of shard ", join.shard_index(), " of ", join.model().fingerprint(),
                     " cannot follow shard ", shard_->index(), " of ", model.fingerprint));
  }
  absl::MutexLock lock(&mu_);
  if (machine_.FenceIfOlderThan(join.epoch())) FencedLocked();
  if (absl::Status s = machine_.AcceptBackup(); !s.ok()) return s;
  return machine_.epoch();
}

absl::Status Replica::ServeBackup(grpc::ServerContext* context, BackupStream* stream) {
  v1::BackupMessage join;
  if (!stream->Read(&join)) return absl::InvalidArgumentError("no join message");
  absl::StatusOr<int64_t> epoch = AcceptJoin(join);
  if (!epoch.ok()) return epoch.status();
  const int64_t attachment = log_.Attach();
  if (attachment == 0) return absl::UnavailableError("shutting down");
  {
    absl::MutexLock lock(&mu_);
    machine_.BackupAttached();  // from now on every change waits for this backup
  }
  PS_LOG(INFO) << "a backup is joining from " << context->peer() << ": sending the state";
  const BackupPlanes planes = OpenBackupPlanes(join);
  // The acknowledgements, read beside the changes written below.
  absl::Notification state_in_place;
  std::thread acks([&] { ReadAcks(stream, attachment, planes, &state_in_place); });
  absl::Cleanup stop_acks = [&] {
    forwarder_.Stop(attachment);
    log_.Detach(attachment);
    context->TryCancel();
    acks.join();
  };
  const StreamChangeSink::Write write = [stream](grpc::ByteBuffer bytes) {
    return stream->Write(bytes);
  };
  auto owned_state = std::make_shared<ShardState>();
  // Without a model yet, the header alone: the backup then waits for the initialisation change.
  shard_->Checkpoint(owned_state.get()).IgnoreError();
  const int64_t sent = owned_state->header.changes();
  log_.Start(attachment, sent);
  const bool ok = WriteState(*owned_state, *epoch, owned_state, write);
  owned_state.reset();  // freed once gRPC is done with it
  if (ok) {
    PS_LOG(INFO) << "a backup joined at change " << sent << ": "
                 << (planes.changes != nullptr ? "making changes on its data plane"
                                               : "streaming changes");
    if (!planes.stages.empty()) {
      state_in_place.WaitForNotification();  // ends with the stream at the latest
      forwarder_.ForwardTo(planes.stages, *epoch, attachment);  // (none go if the stream ended)
    }
    std::unique_ptr<ChangeSink> sink;
    if (planes.changes != nullptr) {
      sink = std::make_unique<PlaneChangeSink>(planes.changes, &log_, &forwarder_, attachment,
                                               &state_in_place, shard_->index());
    } else {
      sink = std::make_unique<StreamChangeSink>(write, *epoch);
    }
    ShipChanges(attachment, *epoch, sent, *sink, write);
  }
  PS_LOG(WARNING) << "the backup at " << context->peer() << " went away"
                  << "; no push is acknowledged until a backup joins";
  return absl::OkStatus();
}

Replica::BackupPlanes Replica::OpenBackupPlanes(const v1::BackupMessage& join) {
  // The changes after the state go on the backup's data plane if it can be reached, and stages
  // on connections of their own there.
  BackupPlanes planes;
  if (!join.has_data_plane()) return planes;
  planes.changes = OpenBackupPlane(join.data_plane(), "its changes go on the replication stream");
  for (int i = 0; planes.changes != nullptr && options_.forward && i < join.stages_size() &&
                  i < kMaxStageConnections;
       ++i) {
    std::shared_ptr<DataConnection> opened =
        OpenBackupPlane(join.stages(i), "stages go on the others only (none: not forwarded)");
    if (opened != nullptr) planes.stages.push_back(std::move(opened));
  }
  return planes;
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

void Replica::ReadAcks(BackupStream* stream, int64_t attachment, const BackupPlanes& planes,
                       absl::Notification* state_in_place) {
  // The stream's end ends a change made on the data plane too. The backup's first comes once its
  // state is in place: no change goes on its data plane before (it would wait there, unread,
  // while the state still comes).
  v1::BackupMessage ack;
  while (stream->Read(&ack)) {
    log_.Acknowledge(attachment, ack.applied());
    if (!state_in_place->HasBeenNotified()) state_in_place->Notify();
  }
  log_.Detach(attachment);
  if (planes.changes != nullptr) planes.changes->End();
  for (const std::shared_ptr<DataConnection>& s : planes.stages) s->End();
  if (!state_in_place->HasBeenNotified()) state_in_place->Notify();
}

void Replica::ShipChanges(int64_t attachment, int64_t epoch, int64_t sent, ChangeSink& sink,
                          const StreamChangeSink::Write& write) {
  for (bool ok = true; ok;) {
    absl::StatusOr<std::optional<std::shared_ptr<const ReplicationLog::Entry>>> next =
        log_.Next(attachment, sent, kHeartbeat);
    if (!next.ok()) return;
    v1::ReplicationMessage out;
    out.set_epoch(epoch);
    if (!next->has_value()) {  // idle: a heartbeat
      ok = WriteMessage(out, write);
      continue;
    }
    const std::shared_ptr<const ReplicationLog::Entry>& entry = **next;
    *out.mutable_change() = HeaderOf(entry->change, entry->length);
    ok = sink.Ship(out, entry);
    sent = entry->change.index;
  }
}

}  // namespace ps
