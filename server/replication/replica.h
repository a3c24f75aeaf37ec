// One of the two processes serving a shard index when replication is on (ps --peer): the primary,
// which serves clients and streams every change of its shard to the backup, acknowledging a push
// only once the backup applied it; or the backup, which repeats those changes (so both states are
// bit-identical) and takes over when its primary has been silent for the failover time.
//
// Roles and epochs. A process starts *joining*: if its peer is a primary it joins it (state
// transfer, then the live stream) and becomes its *backup*; replica 0 becomes the *primary*
// (epoch 1) when its peer has no model to give. A backup that takes over raises the epoch and
// serves alone until a new backup joins it. A primary never serves alone otherwise: without a
// backup it acknowledges nothing (clients then turn to its peer), so a primary that was only cut
// off, or stopped and continued, cannot acknowledge pushes beside the one that replaced it; once
// it sees its peer at a higher epoch it is *fenced* for good (ps exits, and comes back as a
// backup). A backup joins only the primary it followed or one at a higher epoch; with an epoch file
// the highest epoch a replica took part in outlives it, so a replica restarted empty neither joins
// an older primary (whose state misses pushes acknowledged since; it fences it instead) nor starts
// one by itself.
//
// The roles and epochs are RoleMachine's (role_machine.h: the decisions, without threads, sockets
// or clocks); Replica does the talking, keeps the epoch file (epoch_file.h), and owns the thread.
//
// The changes after the state go on the backup's data plane when it has one (transport/
// data_plane.h): the backup gives its primary a ticket in its join, and the primary makes each
// change a call on that connection (ChangeCall: header, values, answered once applied; no gRPC
// stream's copies and flow control on the way), the stream carrying the rest; either way a
// ChangeSink (change_sink.h) ships them. A change the backup does not take ends the stream there
// too (the backup joins again).
//
// Forwarding. A push's gradient of several MiB that comes on the data plane crosses to the
// backup while it still comes in from the worker, rather than after the push was applied (which
// would take the bytes' time twice): the primary sends it as a *stage* (a ChangeCall whose message
// is a Stage) as its runs arrive (StartForward), on connections of their own the backup gave it
// tickets for (so that a worker sending slowly holds up no change), and the backup holds it; the
// push's change then names the stage instead of carrying its values again. Only a gradient
// applied exactly as it came is named (not one clipped or compensated: those changes carry their
// values); a stage no change names is dropped on the backup with the next one. One stage is being
// sent on each of those connections at a time (Options::forward_at_once of them: pushes from
// several workers at once are forwarded together), and the backup holds
// StageForwarder::StageRoom of them at most; a push that finds no connection free or no room is
// replicated as before, and so is every push once a stage failed (until a backup joins again).
// The primary's stages are StageForwarder's (stage_forwarder.h); the shard knows a stage only as
// its push's forward tag.
//
// The gRPC service ps.v1.Replication over this is server/rpc/replication_service.h.
//
// Thread-safe. Owns a thread that settles the role and follows the primary.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "proto/ps.grpc.pb.h"
#include "server/replication/change_sink.h"
#include "server/replication/replication_log.h"
#include "server/replication/role_machine.h"
#include "server/replication/stage_forwarder.h"
#include "server/state/buffer_pool.h"
#include "server/state/parameter_shard.h"
#include "transport/data_connection.h"
#include "transport/data_plane.h"
#include "transport/security.h"

namespace ps {

class Replica {
 public:
  using Role = RoleMachine::Role;

  struct Options {
    std::string peer;  // the other replica's address
    int replica = 0;   // 0 or 1; 0 starts as the primary when its peer has no model to give
    // A backup takes over once its primary has been silent this long (it sends every 100 ms).
    absl::Duration failover = absl::Seconds(1);
    // To reach the peer: TLS, and security.token the replication token (never the job's write
    // token: the peer accepts only its replication credential on ps.v1.Replication).
    ClientSecurity security;
    // Where the highest epoch this replica took part in is kept (fsynced before it acts at a new
    // one); "": not kept, and a replica restarted after a takeover cannot tell a stale primary.
    std::string epoch_file;
    // Whether a primary forwards pushes to its backup as they come in (see above).
    bool forward = true;
    // As a backup: the stage connections it gives its primary (1 to kMaxStageConnections), i.e. how
    // many pushes arriving at once are forwarded; each stage held costs the backup a buffer of the
    // shard's size.
    int forward_at_once = 2;
  };

  // Starts forwarding `buffer`, which a push's values are read into, if this replica is a primary
  // with a backup that takes stages on its data plane (StageForwarder::Start); null otherwise
  // (the push is replicated as before). `buffer` must stay as it is until Finish returned.
  std::unique_ptr<StageForwarder::Forward> StartForward(absl::Span<const float> buffer) {
    return forwarder_.Start(buffer);
  }

  // The data-plane owners of the connections a backup gives its primary tickets for, reserved
  // ones (DataPlane::ReservedOwner): its changes' (kPeerOwner) and its stages' (kStagesOwner + i,
  // i < kMaxStageConnections). PlaneOwners: their kinds, for DataPlane::Options::owner_kinds.
  static constexpr int kPeerOwner = DataPlane::kFirstReservedOwner;
  static constexpr int kStagesOwner = kPeerOwner + 1;
  static constexpr int kMaxStageConnections = DataPlane::kMaxReservedOwners - 1;
  static std::vector<DataPlane::OwnerKind> PlaneOwners();

  // `shard` must outlive this object; `shard_incarnation` is this process's (ShardProcess).
  // `plane`, this process's data plane (null: none), too: as a backup, its primary makes its
  // changes there (OnPlaneChange, which its call handlers must pass them to).
  Replica(ParameterShard* shard, int64_t shard_incarnation, Options options,
          DataPlane* plane = nullptr);
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  // INVALID_ARGUMENT naming the ps flag for options out of range (forward_at_once).
  static absl::Status CheckOptions(const Options& options);
  // Whether pushes are forwarded to the backup as they come in (Options::forward): their values
  // must then come in order.
  bool forwards() const { return options_.forward; }
  // Reads the epoch file (if any), then starts settling the role. Fails if the file cannot be
  // read, or CheckOptions fails. Stop ends every stream and the thread; idempotent.
  absl::Status Start();
  void Stop();

  // For the shard's change listener (under the shard's lock).
  void OnChange(const ShardChange& change);

  // Before a client call: OK if this process serves clients now; UNAVAILABLE (saying why) if it
  // does not, so that clients turn to the peer. A backup whose primary has been silent for the
  // failover time takes over first if `may_take_over`.
  absl::Status CheckServing(bool may_take_over);
  // After a push or initialisation was taken: OK once every change made so far is on the backup
  // (at once for a primary serving alone after a takeover); UNAVAILABLE at `deadline`, or when the
  // backup goes away.
  absl::Status WaitReplicated(absl::Time deadline);

  // The Replication service's calls (see ps.proto), once the caller was let in. ServeBackup
  // serves the backup joining on `stream` until it goes away (OK then): INVALID_ARGUMENT without
  // a join message, FAILED_PRECONDITION for a backup of another shard or model, or when this
  // replica is not the primary; UNAVAILABLE when stopping. The primary writes
  // ReplicationMessages as raw bytes, so that values go out without a copy
  // (transport/tensor_codec.h).
  using BackupStream = grpc::ServerReaderWriter<grpc::ByteBuffer, v1::BackupMessage>;
  absl::Status ServeBackup(grpc::ServerContext* context, BackupStream* stream);
  v1::ReplicaStatusResponse Status(bool take_over);
  // A change the primary this backup follows made on its data plane (DataPlane::CallHandlers's
  // `change`): applied once the state it follows is in place, and answered OK then.
  // PERMISSION_DENIED on a connection that is not the replica peer's, FAILED_PRECONDITION when
  // this replica does not follow that primary on that connection (now), DATA_LOSS for a change
  // that does not parse or fit; the shard's error when it does not apply.
  DataPlane::CallAnswer OnPlaneChange(const DataPlane::Call& call,
                                      DataPlane::ReadValues read_values);

  // Takes no lock: may be called under the shard's (e.g. from its change listener).
  Role role() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return machine_.role(); }  // atomic
  int64_t epoch() const;
  // A primary: changes made on the backup naming a stage (see Forwarding), so far.
  int64_t changes_forwarded() const { return forwarder_.changes_forwarded(); }
  // A primary: the stages being sent to its backup now.
  int stages_sending() const { return forwarder_.stages_sending(); }
  // Why this process was fenced; "" if it was not.
  std::string fenced_reason() const;

 private:
  using Complain = absl::FunctionRef<void(const std::string&)>;
  static bool PlaneOwner(int owner) {
    return owner >= kPeerOwner && owner < kStagesOwner + kMaxStageConnections;
  }
  // The role thread: joins, follows, takes over, checks a lone primary for its replacement.
  void Run();
  // What the role thread does on the role machine's word, about `peer` (its status).
  void Act(RoleMachine::Action action, v1::ReplicaStatusResponse& peer, Complain complain);
  // Asks the peer for its status (one attempt, short deadline).
  grpc::Status ProbePeer(bool take_over, v1::ReplicaStatusResponse* status);

  // The backup's side. Follow joins the primary described by `peer` and applies its stream until
  // it ends.
  absl::Status Follow(const v1::ReplicaStatusResponse& peer);
  using Stream = grpc::ClientReaderWriter<v1::BackupMessage, v1::ReplicationMessage>;
  // The data-plane connections this backup gives its primary tickets for, in `join`: one for
  // its changes (0: none, they come on the stream), and one per stage sent at once.
  struct Tickets {
    uint64_t changes = 0;
    std::vector<uint64_t> stages;
  };
  Tickets OfferTickets(v1::BackupMessage* join);
  // Receives the state transfer that starts a stream (its first message is `first`); nullopt
  // when the primary holds no model yet. FAILED_PRECONDITION if the primary runs another
  // consistency model than this replica.
  absl::StatusOr<std::optional<ShardState>> ReceiveState(const v1::ReplicationMessage& first,
                                                         Stream* stream);
  // Puts the state of the primary of `incarnation` at `epoch` in place, with the role and the
  // tickets' connections together, and only if this replica did not take over (or stop)
  // meanwhile: what it acknowledged as primary must not be overwritten.
  absl::Status PutStateInPlace(const std::optional<ShardState>& state, int64_t epoch,
                               int64_t incarnation, const Tickets& tickets);
  // Applies the stream's changes of `epoch`, acknowledging from `applied` on, until the stream
  // ends (OK) or a change does not apply.
  absl::Status ApplyChanges(Stream* stream, int64_t epoch, int64_t applied);
  // Reads the stream's next message; each counts as hearing from the primary.
  std::function<bool(v1::ReplicationMessage*)> Next(Stream* stream);
  // OK if `m`, made on this backup's data plane, comes from the primary it follows, on the
  // connection it gave it for that (its state in place: the primary makes no change before the
  // backup's first acknowledgement, sent after it); FAILED_PRECONDITION otherwise.
  grpc::Status FromFollowedLocked(const DataPlane::Call& call,
                                  const v1::ReplicationMessage& m) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A stage `m` its primary forwards (OnPlaneChange's, once it passed FromFollowedLocked): held
  // until a change names it.
  grpc::Status OnPlaneStage(const DataPlane::Call& call, const v1::ReplicationMessage& m,
                            DataPlane::ReadValues read_values);
  // Reads the values of a change or stage into `values`, each run counting as hearing from the
  // primary (a large change on a slow link takes longer than the failover time).
  absl::Status ReadFromPrimary(DataPlane::ReadValues read_values, absl::Span<float> values);

  // The primary's side. The epoch a backup joining with `join` is served at; the error
  // ServeBackup returns otherwise.
  absl::StatusOr<int64_t> AcceptJoin(const v1::BackupMessage& join);
  // The backup's data-plane connections: its changes' (null: they go on the stream) and its
  // stages'.
  struct BackupPlanes {
    std::shared_ptr<DataConnection> changes;
    std::vector<std::shared_ptr<DataConnection>> stages;
  };
  BackupPlanes OpenBackupPlanes(const v1::BackupMessage& join);
  // A connection to the data plane the joining backup gave `ticket` for (null when it cannot be
  // opened: logged, saying what happens `otherwise`).
  std::shared_ptr<DataConnection> OpenBackupPlane(const v1::AttachDataPlaneResponse& ticket,
                                                  absl::string_view otherwise);
  // Reads the backup's acknowledgements until its stream ends, then ends the attachment and the
  // planes; `state_in_place` once the first came (its state is in place) or the stream ended.
  void ReadAcks(BackupStream* stream, int64_t attachment, const BackupPlanes& planes,
                absl::Notification* state_in_place);
  // Ships the changes after `sent` to the backup of `attachment` through `sink`, with heartbeats
  // on the stream (`write`) while idle, until it goes away.
  void ShipChanges(int64_t attachment, int64_t epoch, int64_t sent, ChangeSink& sink,
                   const StreamChangeSink::Write& write);

  // The role machine's transitions, with what goes with them here.
  bool TakeOverLocked(absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FencedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ParameterShard* const shard_;
  const int64_t shard_incarnation_;
  const Options options_;
  DataPlane* const plane_;
  // A backup's, for stages and changes on its plane (those unused for a while are freed).
  BufferPool change_values_;
  std::unique_ptr<v1::Replication::Stub> peer_;
  ReplicationLog log_;
  // The primary's stages, under a lock of their own: taken under the shard's lock (never the
  // other way round) and never with mu_ held.
  StageForwarder forwarder_;

  mutable absl::Mutex mu_;
  RoleMachine machine_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* follow_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  // A backup: the data-plane connection its primary makes changes on (its ticket's); 0: none.
  uint64_t plane_connection_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // A backup: the stages its primary forwarded, by id, and those being read; they come on
  // `stages_connections_` (its further tickets' connections, by owner from kStagesOwner on;
  // none: no stage comes).
  std::map<int64_t, BufferPool::Lease> stages_ ABSL_GUARDED_BY(mu_);
  int stages_arriving_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> stages_connections_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace ps
