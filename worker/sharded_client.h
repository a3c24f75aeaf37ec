// The worker-side view of the parameter servers: one flat parameter vector split over S shards.
// Pull and Push fan out to all shards concurrently; every call has a deadline and carries the
// token of ClientOptions::security (over TLS if set there), and calls that failed for a transient
// reason (UNAVAILABLE, DEADLINE_EXCEEDED) are retried with backoff. Retrying is safe: pulls are
// reads, pushes carry a (worker, sequence) id that a shard applies once. A pull that a shard holds
// back (ABORTED: sync barrier, SSP bound) is repeated for as long as it takes.
//
// A shard that restarted (a new process, resumed from its checkpoint) refuses calls made under
// the old registration; the client then registers with it again by itself and repeats the call.
// A shard that came back without the model it held (no checkpoint) fails every call with
// FAILED_PRECONDITION naming it: the job cannot go on, and nothing is re-initialised.
//
// A shard listed as two replicas ("primary/backup", ps --peer) is called at the one that served
// last; a retried call that finds it unreachable or unavailable (or past the deadline) is tried at
// the other at once (which takes over if the primary is gone), and the client registers with it
// as with a restarted shard.
//
// Thread-compatible: one thread drives Pull/Push; Heartbeat and CancelPending may be called from
// others. Registering again happens on whichever of those threads meets the restart first (once
// per restart: the others wait for it).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/model_identity.h"
#include "common/partition.h"
#include "common/security.h"
#include "common/wire_type.h"
#include "proto/ps.grpc.pb.h"

namespace grpc::internal {
class RpcMethod;
}  // namespace grpc::internal

namespace ps {

struct ClientOptions {
  absl::Duration rpc_timeout = absl::Seconds(10);  // deadline of each attempt
  absl::Duration retry_for = absl::Seconds(60);    // give up after transient failures this long
  // TLS credentials (default: plaintext) and the token every call carries (default: none).
  ClientSecurity security = {};
  // What gradients and pulled weights travel as (common/wire_type.h).
  WireType push_type = WireType::kFloat32;
  WireType pull_type = WireType::kFloat32;
};

class ShardedClient {
 public:
  // The version of each shard a pull saw, and which process of that shard served it: a restarted
  // shard's versions go on from its checkpoint, so a version means something only with it.
  struct Versions {
    std::vector<int64_t> version;
    std::vector<int64_t> shard_incarnation;  // 0: unknown (taken as the current process)
    Versions() = default;
    Versions(std::initializer_list<int64_t> v) : version(v), shard_incarnation(v.size(), 0) {}
    int64_t Min() const;
  };

  // `model.num_shards` must equal addresses.size(); an address may list a shard's two replicas
  // ("a/b", see common/cluster.h). worker_id < 0 makes an observer, which may pull but not push.
  ShardedClient(std::vector<std::string> addresses, ModelIdentity model, int worker_id,
                ClientOptions options = {});

  int num_shards() const { return static_cast<int>(replicas_.size()); }
  const ModelIdentity& model() const { return model_; }

  // Registers with every shard (checking they agree on the model) and returns the sequence number
  // this worker's next push should carry: one past the lowest last sequence over the shards, so
  // that a step that reached only some shards is delivered to the others (those that have it
  // answer duplicate); under sync, one past the highest (that step's round has closed). Fails
  // (FAILED_PRECONDITION) if some shards hold a trained model and others none.
  absl::StatusOr<int64_t> Register();
  // The shards' consistency model ("async", "sync", "ssp:S"), known after Register.
  const std::string& consistency() const { return consistency_; }
  // This process's incarnation at shard `shard`, from Register (0 before): pushes, heartbeats and
  // Leave carry it, and a later Register of the same worker id elsewhere supersedes it.
  int64_t incarnation(int shard) const;
  // How many times this client registered again with a restarted shard.
  int reregistrations() const;

  // Offers initial values to every shard. Shards already initialised keep their values, so a
  // restarted initialiser never resets a trained model. Returns how many shards took the values.
  absl::StatusOr<int> Initialize(absl::Span<const float> params);

  // Fills `params` (total_params floats) from all shards, waiting for initialisation if needed
  // (up to ClientOptions::retry_for). `versions` gets what each shard served. A prefetching
  // worker passes the sequence of its push that may still be in flight (see
  // PullRequest.after_sequence); -1: none.
  absl::Status Pull(absl::Span<float> params, Versions* versions, int64_t after_sequence = -1);

  struct PushSummary {
    int64_t max_staleness = 0;  // over shards
    int duplicates = 0;         // shards that had applied this sequence before
    int dropped = 0;            // shards whose consistency policy dropped it (counted there)
    int64_t saturated = 0;      // gradient values beyond the wire type's range, sent as its largest
  };
  // Pushes each shard its slice of `gradient`, tagged with `sequence` and the version of that
  // shard the gradient was computed from (from the Pull that gave the weights). A shard that
  // restarted since that pull gets the gradient as computed from its current version.
  absl::StatusOr<PushSummary> Push(absl::Span<const float> gradient, int64_t sequence,
                                   const Versions& base);

  // Every shard's statistics.
  absl::StatusOr<std::vector<v1::StatsResponse>> Stats();

  // Refreshes this worker's lease on every shard: one attempt each, with `timeout` (keep it well
  // under the lease, so that one stalled shard does not delay the others' heartbeats).
  absl::Status Heartbeat(absl::Duration timeout);

  // Tells every shard this worker is stopping (one attempt each, `timeout`), so that barriers do
  // not wait out its lease.
  absl::Status Leave(absl::Duration timeout);

  // From now on every call makes one attempt of at most `timeout`: for a last call at shutdown,
  // which must not wait on a dead shard. Call while no other call is in progress.
  void LimitCallsTo(absl::Duration timeout);

  // Ends the calls in progress, retries and backoff included, with CANCELLED. Calls started
  // afterwards work as usual. For shutdown: a pull held at a barrier returns now.
  void CancelPending();
  // Ends the calls in progress and every later one with CANCELLED: for a process that is giving
  // up (a call on another thread that has not started yet cannot slip through).
  void Close();

 private:
  // Runs fn(shard) for every shard concurrently, retrying transient failures; returns the first
  // error, prefixed with the shard's address.
  absl::Status ForEachShard(const std::function<grpc::Status(int shard, grpc::ClientContext*)>& fn,
                            bool retry, absl::Duration timeout);
  absl::Status ForEachShard(
      const std::function<grpc::Status(int shard, grpc::ClientContext*)>& fn) {
    return ForEachShard(fn, /*retry=*/true, options_.rpc_timeout);
  }
  // Runs one attempt of fn with a fresh context (deadline `timeout`, token), tracked for
  // CancelPending; CANCELLED if `generation` was cancelled already.
  grpc::Status Attempt(int shard, const std::function<grpc::Status(int, grpc::ClientContext*)>& fn,
                       int64_t generation, absl::Duration timeout);
  // Tracks contexts in flight so that CancelPending can reach them; false if the call's
  // generation was cancelled already.
  bool Track(grpc::ClientContext* context, int64_t generation);
  void Untrack(grpc::ClientContext* context);
  v1::ModelIdentity ModelProto() const;

  // The replica of `shard` calls go to now, its stub and its address.
  int CurrentReplica(int shard) const;
  v1::ParameterServer::Stub* Stub(int shard) const;
  std::string Address(int shard) const;
  // After a transient failure at `replica` of `shard`: calls go to the other replica, if the
  // shard has one and no other thread switched already. Returns whether it switched.
  bool SwitchReplica(int shard, int replica, const grpc::Status& failure);

  // What this client knows of one shard since it last registered there.
  struct Session {
    int64_t incarnation = 0;        // this process's, at the shard
    int64_t shard_incarnation = 0;  // the shard process's
    int64_t registered_version = 0;  // the shard's, at registration
    int64_t version = 0;             // the shard's, at registration or the last pull since
    int64_t last_sequence = -1;     // this worker's last push the shard applied
    bool initialized = false;       // the shard held the model (at a registration or pull)
    std::string consistency;
  };
  Session SessionOf(int shard) const;
  // One Register call to `shard`; records the session. `resume_sequence` >= 0 when registering
  // again with a restarted shard. Fails if the shard lost the model it held before.
  grpc::Status RegisterWith(int shard, grpc::ClientContext* context, int64_t resume_sequence);
  // Registers again with `shard`, which said it restarted, unless another thread already did since
  // the session whose shard_incarnation was `stale`.
  grpc::Status Reregister(int shard, int64_t stale, int64_t generation);

  struct Replica {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::ParameterServer::Stub> stub;
    // Initialize and Push on raw bytes: tensors go out through common/tensor_codec.h.
    std::unique_ptr<grpc::internal::RpcMethod> initialize, push;
  };
  const Replica& CurrentReplicaOf(int shard) const;
  std::vector<std::vector<Replica>> replicas_;  // by shard: one, or two with replication
  std::string authorization_;  // the metadata value every call carries; "" : none
  ModelIdentity model_;
  int worker_id_;
  ClientOptions options_;
  std::vector<Range> ranges_;  // shard i's range of the flat vector
  std::string consistency_;

  // One per shard: held while registering again, so that two threads noticing one restart do
  // not register twice (the second registration would supersede the first).
  std::vector<std::unique_ptr<absl::Mutex>> register_mu_;
  mutable absl::Mutex sessions_mu_;
  std::vector<Session> sessions_ ABSL_GUARDED_BY(sessions_mu_);
  std::vector<int> current_ ABSL_GUARDED_BY(sessions_mu_);  // by shard: the replica called
  int reregistrations_ ABSL_GUARDED_BY(sessions_mu_) = 0;
  // The sequence of the push in progress or of the next one, for registering again.
  int64_t next_sequence_ ABSL_GUARDED_BY(sessions_mu_) = 0;

  absl::Mutex mu_;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // incremented by CancelPending
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);
};

// Cancels a client's pending calls once SIGTERM/SIGINT arrives, so that a process waiting on a
// shard (for the initialiser, at a barrier, or retrying) stops at once. Destruction requests
// shutdown and joins the thread: declare it after the client it watches.
class CancelOnShutdown {
 public:
  explicit CancelOnShutdown(ShardedClient* client);
  ~CancelOnShutdown() { Join(); }
  // Requests shutdown and returns once the pending calls were cancelled; calls made afterwards
  // (a last Leave, a final pull) are not cancelled. Idempotent.
  void Join();

 private:
  std::thread thread_;
};

}  // namespace ps
