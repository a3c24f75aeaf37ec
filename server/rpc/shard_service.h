// The gRPC face of a ParameterShard: checks each caller's token, parses and validates requests,
// streams tensors in chunks, and translates results to gRPC statuses. Thread-safe (gRPC calls it
// from many threads).
//
// Register, Heartbeat, Leave, GetStats and Pull use gRPC's callback API on raw bytes: a pull held
// back (sync barrier, SSP bound, waiting for the initialiser) holds no thread, and a request that
// does not parse gets INVALID_ARGUMENT rather than gRPC's bare INTERNAL. Push and Initialize are
// synchronous client streams, each under a CallLimit and the StreamWatchdog.
#pragma once

#include <atomic>
#include <optional>

#include "proto/ps.grpc.pb.h"
#include "server/checkpoints/checkpointer.h"
#include "server/replication/replica.h"
#include "server/rpc/call_limits.h"
#include "server/rpc/payload.h"
#include "server/rpc/pull_views.h"
#include "server/rpc/shard_metrics.h"
#include "server/state/parameter_shard.h"
#include "transport/security.h"
#include "transport/shared_segments.h"
#include "transport/tensor_codec.h"

namespace ps {

// What the service tells clients about the shard process it runs in.
struct ShardProcess {
  // New at every start (see RegisterResponse.shard_incarnation); requests naming another are
  // refused so that clients register again.
  int64_t incarnation = 0;
  int64_t resumed_version = -1;  // the checkpoint's version resumed from at start; -1: none
  int64_t updates_lost = -1;  // applied after that checkpoint by the previous process; -1: unknown
};

// OK if the token the call carries allows `access` (then `caller`, if given, says which worker it
// may act as); UNAUTHENTICATED or PERMISSION_DENIED (naming `call`) otherwise.
grpc::Status AuthorizeCall(const TokenAuthenticator& tokens, const grpc::ServerContextBase& context,
                           Access access, absl::string_view call, Caller* caller = nullptr);

// Limits on what clients may hold at once. With S the shard's size in bytes, a shard holds at
// most (max_streams + max_pulls) * S in request buffers and snapshots, plus 4 * S idle buffers
// kept for reuse (freed after ParameterShard::kBuffersUnused unused), plus shm_clients * 2 * S of
// shared memory, plus (pull_views + 2) * S, beside its values and optimizer state.
struct ServiceLimits {
  int max_streams = 16;  // Push and Initialize calls in progress
  int max_pulls = 256;   // Pull calls in progress, held ones included
  // Of those, the most that one worker's own token may hold of each kind (per-worker identity:
  // one worker cannot take every place); 0: no such cap.
  int max_calls_per_worker = 4;
  absl::Duration stream_idle = absl::Seconds(30);   // a stream moving no message this long ends
  absl::Duration stream_total = absl::Minutes(10);  // and none lasts longer than this
  // Clients on this host that may move tensors through shared memory at once (0: none); each
  // costs up to 2 x S of shared memory once used (transport/shared_segments.h).
  int shm_clients = 16;
  // Clients that may hold a data-plane connection at once (transport/data_plane.h); each costs
  // two threads, no buffer.
  int data_plane_clients = 64;
  // Workers whose compressed pulls the shard follows at once (server/rpc/pull_views.h); each
  // costs S. Beyond that the least recently pulling one gets whole values at its next pull.
  int pull_views = 64;
};

using ShardServiceBase = v1::ParameterServer::WithRawCallbackMethod_Register<
    v1::ParameterServer::WithRawCallbackMethod_Pull<
        v1::ParameterServer::WithRawCallbackMethod_Heartbeat<
            v1::ParameterServer::WithRawCallbackMethod_Leave<
                v1::ParameterServer::WithRawCallbackMethod_GetStats<
                    v1::ParameterServer::WithRawCallbackMethod_AttachSharedMemory<
                        v1::ParameterServer::WithRawCallbackMethod_AttachDataPlane<
                            v1::ParameterServer::WithRawCallbackMethod_Checkpoint<
                                v1::ParameterServer::Service>>>>>>>>;

class ShardService final : public ShardServiceBase {
 public:
  // Every call is first checked against `tokens` (by default none: everyone may do everything).
  // With a `replica` (replication on), calls are served only while it serves them, and a push or
  // initialisation is answered once the backup has it.
  // `metrics` (ps --metrics_port): push/pull latencies and bytes; by default none.
  // `checkpointer` (ps --checkpoint_dir): what Checkpoint writes with; by default none.
  // `data_plane`: tensors of clients that attach to it travel there; by default none.
  ShardService(ParameterShard* shard, const ShardProcess& process, const ServiceLimits& limits,
               TokenAuthenticator tokens = {}, Replica* replica = nullptr,
               ServiceMetrics metrics = {}, Checkpointer* checkpointer = nullptr,
               DataPlane* data_plane = nullptr);
  // Stops taking calls made on the data plane (waits until those in progress were answered).
  ~ShardService() override;

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  // Synchronous client streams on raw bytes (registered by the constructor).
  grpc::Status Initialize(grpc::ServerContext* context,
                          grpc::ServerReader<grpc::ByteBuffer>* reader,
                          v1::InitializeResponse* response);
  grpc::Status Push(grpc::ServerContext* context, grpc::ServerReader<grpc::ByteBuffer>* reader,
                    v1::PushResponse* response);
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Pull(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* AttachSharedMemory(grpc::CallbackServerContext* context,
                                               const grpc::ByteBuffer* request,
                                               grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* AttachDataPlane(grpc::CallbackServerContext* context,
                                            const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) override;
  // Writes the checkpoint on gRPC's callback thread: an operator's call, rare and bounded by
  // one shard-sized file.
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;

  // The shard's statistics `stats` with this service's own (its paths' counts, the checkpoints'
  // health), as GetStats answers them and the --stats_json file holds them.
  v1::StatsResponse StatsProto(const ShardStats& stats) const;

  // Gives back the shared memory of co-located clients idle for kSharedMemoryUnused (call it
  // every second or so): a shard at rest holds its values and optimizer state, no more.
  void TrimSharedMemory(absl::Time now) { segments_.Trim(now, kSharedMemoryUnused); }
  // Frees what `worker` holds here beside its membership: its shared-memory segment, its pull
  // view, its data-plane ticket and connections (whose held pulls end CANCELLED). Leave calls it,
  // and the shard's housekeeping for a worker whose lease expired (ShardServer::Wait); counted in
  // StatsResponse.workers_released. Its client attaches again at its next calls (its shared
  // memory and data plane lost, it asks for them anew).
  void ReleaseWorker(int worker, absl::string_view why);
  static constexpr absl::Duration kSharedMemoryUnused = absl::Seconds(5);

 private:
  class PullWriter;
  class PlaneSend;
  class PlanePull;
  template <typename Response>
  using RawStream = grpc::Status (ShardService::*)(grpc::ServerContext*,
                                                   grpc::ServerReader<grpc::ByteBuffer>*,
                                                   Response*);

  // Replaces the generated synchronous handler of `method` ("Push") with one that reads raw
  // bytes and calls `handle`.
  template <typename Response>
  void ReadRawBytes(absl::string_view method, RawStream<Response> handle);

  // What a call needs to be let in, whichever transport it came by (gRPC, or a data-plane
  // connection, whose calls go through the same checks and caps). Admit checks what is asked, in
  // this order:
  //   1. the caller's token allows `access` (kWrite for a call made as a worker: `acts_as` >= 0),
  //      once per call and before its request is parsed, so that a stranger's bytes are never
  //      looked at (the API itself is public, and reflection describes it); a call made on the
  //      data plane has what its connection's token proved when its ticket was issued;
  //   2. the caller may act as worker `acts_as` (per-worker identity; negative: an observer);
  //   3. the replica serves clients (`serving`: Replica::CheckServing, may take over);
  //   4. a place among `limit`'s calls, which the caller's own worker token counts against its
  //      cap (so the token is checked before the place is taken);
  //   5. the request's `shard_incarnation` is 0 (unchecked) or this process's;
  //   6. the call's gRPC stream is watched from then on (`watched`: StreamWatchdog; a data-plane
  //      connection has its own bounds: a call's values are out by its deadline, or it ends).
  // What is known only once the request is parsed goes to a second Admit of the same call.
  struct CallNeeds {
    CallNeeds(const char* call, Access access) : call(call), access(access) {}
    CallNeeds& ActsAs(int worker_id) {
      acts_as = worker_id;
      return *this;
    }
    CallNeeds& Serving() {
      serving = true;
      return *this;
    }
    CallNeeds& Limit(CallLimit* calls) {
      limit = calls;
      return *this;
    }
    CallNeeds& ShardIncarnation(int64_t claimed) {
      shard_incarnation = claimed;
      return *this;
    }
    CallNeeds& Watched() {
      watched = true;
      return *this;
    }
    const char* call;  // names the call in refusals ("Push")
    Access access;
    std::optional<int> acts_as;
    bool serving = false;
    CallLimit* limit = nullptr;
    std::optional<int64_t> shard_incarnation;
    bool watched = false;
  };
  // One call let in (so far): whom its token names, and the place and the watchdog guard it holds
  // until it ends. Not thread-safe (one call's).
  class Admission {
   public:
    // A gRPC call's: its token is yet to be checked.
    Admission() = default;
    // A call made on a data-plane connection of `owner`: its token was checked when the
    // connection's ticket was issued, and the connection stands for that one worker (or observer),
    // whatever its token may act as.
    Admission(const DataPlane::Credential& credential, int owner)
        : authorized_(credential.access), caller_(credential.caller), owner_(owner) {}
    Admission(Admission&&) = default;
    // REQUIRES: admitted Watched().
    StreamWatchdog::Guard& guard() { return *guard_; }
    // What its token proved, for a data-plane connection opened by this call. REQUIRES: admitted.
    DataPlane::Credential credential() const { return {caller_, *authorized_}; }

   private:
    friend class ShardService;
    std::optional<Access> authorized_;  // what the token was found to allow
    Caller caller_;
    std::optional<int> owner_;  // a data-plane connection's owner
    std::optional<CallLimit::Slot> slot_;
    std::optional<StreamWatchdog::Guard> guard_;
  };
  // OK if `admission`'s call may go on as `needs` says (then `admission` holds what it took);
  // otherwise the refusal as the client sees it: UNAUTHENTICATED or PERMISSION_DENIED (token,
  // identity), UNAVAILABLE (this replica does not serve), RESOURCE_EXHAUSTED (no place),
  // ShardRestartedStatus (the client registered with an earlier process of this shard).
  // `context`: the gRPC call's, or null for a call made on the data plane.
  grpc::Status Admit(grpc::ServerContextBase* context, const CallNeeds& needs,
                     Admission* admission);
  // The payload of the push whose header is `h` and whose first message's data is `data`, from
  // the source chosen once: the shared push region `h` names (taken now, so that a segment gone,
  // after which the client sends the push over gRPC, is not counted as a rejected push) or the
  // stream's chunks, into `source`; otherwise the refusal
  // as the client sees it (a segment lost: SharedMemoryLostStatus, its detail included).
  grpc::Status OpenPushPayload(grpc::ServerContext* context,
                               grpc::ServerReader<grpc::ByteBuffer>* reader,
                               const v1::PushHeader& h, std::optional<TensorMessage> data,
                               Admission* admission, std::unique_ptr<PayloadSource>* source);
  // What a request for a tensor path (AttachSharedMemory, AttachDataPlane) claims: to be the
  // worker it names, of this shard process.
  template <typename Request>
  static CallNeeds AttachClaims(const Request& r, CallNeeds needs);
  // `refused`, a refusal of registration `r`, naming the first tensor that differs where the
  // client's layout (r.layout(), inline JSON only: never a file of this host) is not the shard's
  // model (a layout, or a network's tensors).
  absl::Status NamingLayoutDifference(absl::Status refused, const v1::RegisterRequest& r) const;
  // OK if a client of `model` acting as `worker` may have a tensor path of its own (shared
  // memory, the data plane): the model is this shard's, a worker id is one of the job's, and
  // `incarnation` (0: unchecked) is the worker's current process.
  absl::Status CheckAttacher(int worker, const v1::ModelIdentity& model,
                             int64_t incarnation) const;
  // The push whose header is `h` and whose payload comes from `source`, once admitted: its
  // header checked, the payload read into a push slot and committed (nothing applied if any of it
  // fails); `start` is when the call began. Its answer into `response`. A replica's primary
  // forwards a tensor that comes on the data plane to its backup as it comes
  // (Replica::StartForward).
  grpc::Status ApplyPush(const v1::PushHeader& h, std::unique_ptr<PayloadSource> source,
                         absl::Time start, v1::PushResponse* response);
  // A push made on a data-plane connection (DataPlane::Call): admitted as Push is (its token's
  // credential from the connection), then applied as Push's.
  DataPlane::CallAnswer PushOnPlane(const DataPlane::Call& call, DataPlane::ReadValues read_values);
  // A pull made on a data-plane connection: admitted as Pull is, answered (`answer`) once its
  // values were sent there, or at once if it is refused; cancelled (its place let go) when the
  // connection ends while the shard still holds it (PlanePullEnded), as gRPC's Pull is.
  void PullOnPlane(const DataPlane::Call& call, DataPlane::Answer answer);
  // The plane pulls in progress, by an id of their own (the shard's read ticket once the shard
  // holds one, 0 before and once answered): HoldPlanePull adds one; PlanePullWaits records its
  // ticket (cancelling the read at once if its connection ended meanwhile); ForgetPlanePull
  // drops it when it is answered; PlanePullEnded cancels those of a connection that ended.
  int64_t HoldPlanePull(uint64_t connection);
  void PlanePullWaits(int64_t id, int64_t ticket);
  void ForgetPlanePull(int64_t id);
  void PlanePullEnded(uint64_t connection);
  // OK if a call made on the data plane names the connection and transfer it came as
  // (INVALID_ARGUMENT otherwise) on a client's connection (PERMISSION_DENIED on a reserved
  // owner's: the replica peer's carries no client's call). Who it acts as is Admit's.
  static grpc::Status CheckPlaneCall(const DataPlane::Call& call, uint64_t connection,
                                     uint64_t transfer);
  // ShardRestartedStatus unless `claimed` (a client's shard incarnation, 0: unchecked) is this
  // process's.
  grpc::Status CheckShardIncarnation(std::optional<int64_t> claimed) const;
  // Pull metrics: `payload` bytes since `start`.
  void RecordPull(int64_t payload, absl::Time start);
  // Logs, once, that a pulled weight was saturated to `type`'s range.
  void NoteSaturated(int64_t saturated, WireType type);
  // Counts a push taken (shared memory, metrics: its `payload` bytes since `start`).
  void RecordPush(const v1::PushHeader& h, int64_t payload, absl::Time start);
  // A unary call on raw bytes: admits `needs` (the token) before parsing, parses the request
  // (INVALID_ARGUMENT naming the call if it does not), admits what the request claims
  // (claims(request, needs of the same call and access): a CallNeeds), runs
  // handler(request, &response) (a grpc::Status; or handler(request, &response, admission) for
  // one that needs to know whom it admitted), serialises the response and finishes.
  template <typename Request, typename Response, typename Claims, typename Handler>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context, const grpc::ByteBuffer* in,
                                  grpc::ByteBuffer* out, const CallNeeds& needs, Claims claims,
                                  Handler handler);
  // OK without replication or once the backup has every change so far (Replica::WaitReplicated),
  // waiting until a little before the call's deadline.
  grpc::Status WaitReplicated(const grpc::ServerContextBase& context) const;
  grpc::Status WaitReplicated(absl::Time deadline) const;

  ParameterShard* shard_;
  const ShardProcess process_;
  const TokenAuthenticator tokens_;
  Replica* const replica_;
  const ServiceMetrics metrics_;
  Checkpointer* const checkpointer_;
  CallLimit streams_, pulls_;
  StreamWatchdog watchdog_;
  SharedSegments segments_;
  DataPlane* const data_plane_;
  PullViews pull_views_;
  std::atomic<int64_t> shm_pushes_{0}, shm_pulls_{0}, data_plane_pushes_{0}, data_plane_pulls_{0},
      compressed_pulls_{0}, workers_released_{0};
  std::atomic<bool> pull_saturated_{false};  // a 16-bit pull had to saturate a weight (logged)
  struct HeldPlanePull {
    uint64_t connection = 0;
    int64_t ticket = 0;  // the shard's read ticket while it holds the pull
    bool ended = false;  // its connection ended
  };
  absl::Mutex plane_pulls_mu_;
  std::map<int64_t, HeldPlanePull> plane_pulls_ ABSL_GUARDED_BY(plane_pulls_mu_);
  int64_t next_plane_pull_ ABSL_GUARDED_BY(plane_pulls_mu_) = 1;
};

}  // namespace ps
