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
// The changes after the state go on the backup's data plane when it has one (server/rpc/
// data_plane.h): the backup gives its primary a ticket in its join, and the primary makes each
// change a call on that connection (ChangeCall: header, values, answered once applied; no gRPC
// stream's copies and flow control on the way), the stream carrying the rest. A change the
// backup does not take ends the stream there too (the backup joins again).
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
// several workers at once are forwarded together), and the backup holds StageRoom of them at
// most; a push that finds no connection free or no room is replicated as before, and so is every
// push once a stage failed (until a backup joins again).
//
// Thread-safe. Owns a thread that settles the role and follows the primary.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/state/buffer_pool.h"
#include "transport/data_connection.h"
#include "common/fill_progress.h"
#include "transport/security.h"
#include "proto/ps.grpc.pb.h"
#include "server/replication/replication_log.h"
#include "transport/data_plane.h"
#include "server/state/parameter_shard.h"

namespace ps {

class Replica {
 public:
  enum class Role { kJoining, kBackup, kPrimary, kFenced };
  static const char* RoleName(Role role);

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
    // As a backup: the stage connections it gives its primary (1 to
    // DataPlane::kMaxReplicaStageConnections), i.e. how many pushes arriving at once are
    // forwarded; each stage held costs the backup a buffer of the shard's size.
    int forward_at_once = 2;
  };

  // The stages a backup with `connections` stage connections holds at most: those being sent,
  // and two more (one for one connection) whose bytes came and whose changes have not yet; the
  // smallest gradient worth forwarding (a smaller one takes about as long to forward as to send
  // after it was applied).
  static int StageRoom(int connections) { return connections + std::min(connections, 2); }
  static constexpr uint64_t kMinForwardBytes = 4 << 20;

  // A push's gradient being forwarded to the backup as it comes in (the primary's side). Thread-
  // compatible: the push's reading thread feeds it. Destroying it pads the stage if Finish was
  // not called, and drops it on the backup unless the push's change named it.
  class Forward {
   public:
    ~Forward();
    Forward(const Forward&) = delete;
    Forward& operator=(const Forward&) = delete;
    // A run of the buffer's values is in place (a ValuesSeen: each value once; the runs of a
    // striped tensor's parts from their lanes' threads at once). Sent once every value before it
    // is in place too.
    void Seen(absl::Span<const float> run);
    // The buffer was read, whole or not (what was not seen then goes as it is, so that the
    // connection stays usable). Waits until the backup holds the stage or refused it, and
    // returns its id if it holds it and every value was seen (for PushSlot::Forwarded), 0
    // otherwise. The buffer may change once this returned.
    int64_t Finish();
    // The push's change named the stage (PushOutcome::staged): the backup keeps it for that.
    void Named() { named_ = true; }

   private:
    friend class Replica;
    Forward(Replica* replica, int64_t id, absl::Span<const float> buffer)
        : replica_(replica), id_(id), buffer_(buffer), progress_(buffer.size()) {}
    Replica* const replica_;
    const int64_t id_;
    const absl::Span<const float> buffer_;
    FillProgress progress_;
    absl::Mutex mu_;
    int64_t prefix_ ABSL_GUARDED_BY(mu_) = 0;                // values in place from the start
    std::map<int64_t, int64_t> ahead_ ABSL_GUARDED_BY(mu_);  // runs past it: offset -> end
    bool whole_ = false, held_ = false, named_ = false;
    std::thread thread_;  // sends the stage; joined by Finish
  };
  // Starts forwarding `buffer`, which a push's values are read into, if this replica is a primary
  // with a backup that takes stages on its data plane, one of their connections sends no other
  // stage, the backup has room, and `buffer` is large enough; null otherwise (the push is
  // replicated as before).
  // `buffer` must stay as it is until Finish returned.
  std::unique_ptr<Forward> StartForward(absl::Span<const float> buffer);

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

  // The Replication service's calls (see ps.proto). The primary writes ReplicationMessages as raw
  // bytes, so that values go out without a copy (transport/tensor_codec.h).
  using BackupStream = grpc::ServerReaderWriter<grpc::ByteBuffer, v1::BackupMessage>;
  grpc::Status ServeBackup(grpc::ServerContext* context, BackupStream* stream);
  v1::ReplicaStatusResponse Status(bool take_over);
  // A change the primary this backup follows made on its data plane (DataPlane::CallHandlers's
  // `change`): applied once the state it follows is in place, and answered OK then.
  // PERMISSION_DENIED on a connection that is not the replica peer's, FAILED_PRECONDITION when
  // this replica does not follow that primary on that connection (now), DATA_LOSS for a change
  // that does not parse or fit; the shard's error when it does not apply.
  DataPlane::CallAnswer OnPlaneChange(const DataPlane::Call& call,
                                      DataPlane::ReadValues read_values);

  // Takes no lock: may be called under the shard's (e.g. from its change listener).
  Role role() const { return role_.load(); }
  int64_t epoch() const;
  // A primary: changes made on the backup naming a stage (see Forwarding), so far.
  int64_t changes_forwarded() const;
  // A primary: the stages being sent to its backup now.
  int stages_sending() const;
  // Why this process was fenced; "" if it was not.
  std::string fenced_reason() const;

 private:
  // The role thread: joins, follows, takes over, checks a lone primary for its replacement.
  void Run();
  // Asks the peer for its status (one attempt, short deadline).
  grpc::Status ProbePeer(bool take_over, v1::ReplicaStatusResponse* status);
  // Joins the primary described by `peer` and applies its stream until it ends.
  absl::Status Follow(const v1::ReplicaStatusResponse& peer);
  using Stream = grpc::ClientReaderWriter<v1::BackupMessage, v1::ReplicationMessage>;
  // Receives the state transfer that starts a stream (its first message is `first`); nullopt
  // when the primary holds no model yet. FAILED_PRECONDITION if the primary runs another
  // consistency model than this replica.
  absl::StatusOr<std::optional<ShardState>> ReceiveState(const v1::ReplicationMessage& first,
                                                         Stream* stream);
  // Reads the stream's next message; each counts as hearing from the primary.
  std::function<bool(v1::ReplicationMessage*)> Next(Stream* stream);
  // The primary's side: a connection to the data plane the joining backup gave `ticket` for
  // (null when it cannot be opened: logged, saying what happens `otherwise`), and a change made
  // on it (acknowledged in the log once answered OK; false, logged, if it was not).
  std::shared_ptr<DataConnection> OpenBackupPlane(const v1::AttachDataPlaneResponse& ticket,
                                                  absl::string_view otherwise);
  bool SendOnPlane(DataConnection& plane, const v1::ReplicationMessage& change,
                   absl::Span<const float> values, int64_t attachment);
  // The primary's: forwards go on `planes` from now on, at `epoch`, for the backup of log
  // attachment `attachment` (not if a newer one's go already); the stages of an earlier one are
  // forgotten. StopForwarding: none go, if they went to `attachment`'s backup.
  void ForwardTo(std::vector<std::shared_ptr<DataConnection>> planes, int64_t epoch,
                 int64_t attachment);
  void StopForwarding(int64_t attachment);
  // The primary's: whether the backup of `attachment` holds `stage`, for the change about to
  // name it; false: the change carries its values. The stage counts as held until StageUsed
  // (once that change was answered, `applied` or not).
  bool NameStage(int64_t stage, int64_t attachment);
  void StageUsed(int64_t stage, bool applied);
  // The backup's: OK if `m`, made on its data plane, comes from the primary it follows, on the
  // connection it gave it for that (its state in place: the primary makes no change before the
  // backup's first acknowledgement, sent after it); FAILED_PRECONDITION otherwise.
  grpc::Status FromFollowedLocked(const DataPlane::Call& call,
                                  const v1::ReplicationMessage& m) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The backup's: a stage `m` its primary forwards (OnPlaneChange's, once it passed
  // FromFollowedLocked): held until a change names it.
  grpc::Status OnPlaneStage(const DataPlane::Call& call, const v1::ReplicationMessage& m,
                            DataPlane::ReadValues read_values);
  // Moves to `epoch`, after writing it to the epoch file; false (logged) if that failed.
  bool SetEpochLocked(int64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool TakeOverLocked(absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FenceLocked(std::string reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration SilenceLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool veteran() const;

  ParameterShard* const shard_;
  const int64_t shard_incarnation_;
  const Options options_;
  DataPlane* const plane_;
  // A backup's, for stages and changes on its plane (those unused for a while are freed).
  BufferPool change_values_;
  std::unique_ptr<v1::Replication::Stub> peer_;
  ReplicationLog log_;

  mutable absl::Mutex mu_;
  // Changed under mu_ only; atomic so that role() needs no lock (it is read under the shard's).
  std::atomic<Role> role_{Role::kJoining};
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // A primary that took over serves alone until a backup joins it.
  bool alone_ ABSL_GUARDED_BY(mu_) = false;
  // A backup: holds the state of the primary it followed (incarnation `followed_`), with every
  // change that primary acknowledged, and may take over.
  bool caught_up_ ABSL_GUARDED_BY(mu_) = false;
  int64_t followed_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_heard_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  grpc::ClientContext* follow_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  // A backup: the data-plane connection its primary makes changes on (its ticket's); 0: none.
  uint64_t plane_connection_ ABSL_GUARDED_BY(mu_) = 0;
  // A state transfer is being received: no takeover meanwhile (its end replaces the state).
  bool transferring_ ABSL_GUARDED_BY(mu_) = false;
  // Took part in the job before (an epoch from the epoch file): never starts a primary itself.
  bool veteran_ ABSL_GUARDED_BY(mu_) = false;
  std::string fenced_reason_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // A backup: the stages its primary forwarded, by id, and those being read; they come on
  // `stages_connections_` (its further tickets' connections, by owner from kReplicaStages on;
  // none: no stage comes).
  std::map<int64_t, BufferPool::Lease> stages_ ABSL_GUARDED_BY(mu_);
  int stages_arriving_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> stages_connections_ ABSL_GUARDED_BY(mu_);

  // The primary's forwarding, under a lock of its own: taken under the shard's lock (never the
  // other way round) and never with mu_ held.
  mutable absl::Mutex forward_mu_;
  std::vector<std::shared_ptr<DataConnection>> forward_planes_ ABSL_GUARDED_BY(forward_mu_);
  int64_t forward_epoch_ ABSL_GUARDED_BY(forward_mu_) = 0;
  int64_t forward_attachment_ ABSL_GUARDED_BY(forward_mu_) = 0;  // the newest forwarded to
  int64_t next_stage_ ABSL_GUARDED_BY(forward_mu_) = 1;
  // The stages the backup may hold (one being sent on forward_planes_[plane], held, named by a
  // change, or being dropped by a stage sent since), and those of them no change names, dropped
  // with the next stage.
  enum class StageState { kSending, kHeld, kNamed, kDropping };
  struct Staged {
    StageState state = StageState::kHeld;
    int plane = -1;  // while kSending
  };
  std::map<int64_t, Staged> staged_ ABSL_GUARDED_BY(forward_mu_);
  std::vector<int64_t> drops_ ABSL_GUARDED_BY(forward_mu_);
  int64_t changes_forwarded_ ABSL_GUARDED_BY(forward_mu_) = 0;
  std::thread thread_;
};

// The Replication service over a Replica: checks that the caller holds the replication token
// (Access::kReplicate: a backup receives the model, makes the primary acknowledge pushes, and
// claims epochs that fence a primary or make a backup take over, so only the replica peer may
// call), then hands the call over. Status reads raw bytes, so that the token is checked before
// anything is parsed and a request that does not parse gets INVALID_ARGUMENT naming the method.
class ReplicationService final
    : public v1::Replication::WithRawCallbackMethod_Status<v1::Replication::Service> {
 public:
  ReplicationService(Replica* replica, TokenAuthenticator tokens);
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  // Replaces the generated handler of Replicate, writing raw bytes.
  grpc::Status Replicate(grpc::ServerContext* context, Replica::BackupStream* stream);

 private:
  Replica* replica_;
  const TokenAuthenticator tokens_;
};

}  // namespace ps
