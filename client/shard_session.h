// This client's dealings with one shard: the shard's replicas (one gRPC path each: channel and
// stub) and which of them calls go to, this client's registration there (incarnations, versions,
// the consistency model), and the paths its tensors take, in fallback order: shared memory with a
// shard on this host, else the data plane, else gRPC (client/tensor_path.h), each inside
// compression where the client compresses (client/compressed_path.h). A path that stops
// working is dropped, and shared memory (else a data-plane connection) asked for again with
// backoff (100 ms doubling to 10 s) while tensors go over gRPC.
//
// Thread-safe. The calls it makes itself (Register, AttachSharedMemory, AttachDataPlane) run
// through the client's Attempter: deadline, token, and cancellation as every call of the client.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/compressed_path.h"
#include "client/connection_probe.h"
#include "client/data_plane_path.h"
#include "client/grpc_path.h"
#include "client/shard_call.h"
#include "client/sharded_client.h"
#include "client/shared_memory_path.h"
#include "common/partition.h"

namespace ps {

// How to get a job whose shard lost its model going again.
inline constexpr char kLostModelFix[] =
    "Restart it with the --checkpoint_dir it wrote checkpoints to, or start the whole job again";

class ShardSession {
 public:
  // What this client knows of the shard since it last registered there.
  struct State {
    int64_t incarnation = 0;         // this process's, at the shard
    int64_t shard_incarnation = 0;   // the shard process's
    int64_t registered_version = 0;  // the shard's, at registration
    int64_t version = 0;             // the shard's, at registration or the last pull since
    int64_t last_sequence = -1;      // this worker's last push the shard applied
    bool initialized = false;        // the shard held the model (at a registration or pull)
    std::string consistency;
    bool shared_memory = false;  // whether tensors go through shared memory
  };
  // One replica: its address and gRPC path, whether a call reached it once (failures since are
  // outages, not settings that do not fit), and what the last probe found (connection_probe.h),
  // used for 5 s.
  struct Replica {
    std::string address;
    std::unique_ptr<GrpcPath> rpc;
    std::atomic<bool> reached{false};
    absl::Mutex mu;
    absl::Time probed_at ABSL_GUARDED_BY(mu) = absl::InfinitePast();
    ProbeFinding finding ABSL_GUARDED_BY(mu);
  };
  // One attempt of a call of the session's own (its context tracked by the client).
  using Attempter =
      std::function<AttemptEnd(const std::function<AttemptEnd(grpc::ClientContext*)>&)>;
  // What every session of a client shares: who it is, the model, the options; `threads` runs
  // the asks for a data-plane connection.
  struct Client {
    int worker_id;
    v1::ModelIdentity model;
    std::string layout;  // a tensor layout's JSON (ModelIdentity::layout); "" for other models
    const ClientOptions* options;
    CallThreads* threads;
  };

  // Shard `index` at `addresses` (one, or "primary/backup": common/cluster.h), its `range` of
  // the flat vector.
  ShardSession(int index, const std::string& addresses, Range range, Client client);

  // The replica calls go to now, and the others.
  int current() const;
  Replica& replica(int i) const { return *replicas_[i]; }
  Replica& current_replica() const { return replica(current()); }
  int replicas() const { return static_cast<int>(replicas_.size()); }
  // Whether a call reached one of the shard's replicas once.
  bool reached() const;
  // After a transient failure at `replica`: calls go to the other replica, if there is one and no
  // other thread switched already. Returns whether it switched.
  bool SwitchReplica(int replica, const absl::Status& failure);
  // What probing `replica` finds, probed again only 5 s after the last probe.
  ProbeFinding Probe(Replica& replica, const ClientSecurity& security) const;

  State state() const;
  // Registers with the replica called now (`context`: the call's); `resume_sequence` >= 0 when
  // registering again with a restarted shard. Fails if the shard lost the model it held before.
  grpc::Status Register(grpc::ClientContext* context, int64_t resume_sequence,
                        const Attempter& attempt);
  // Registers again with the shard, which said it restarted, unless another thread already did
  // since the registration whose shard incarnation was `stale`.
  AttemptEnd Reregister(int64_t stale, int64_t resume_sequence, const Attempter& attempt);
  // How many times this client registered again with the shard.
  int reregistrations() const;

  // One attempt at pulling the shard's range into `values` (its part of the caller's buffer),
  // `seen` told of each run as it is in place. What the pull served: the version, of which shard
  // process.
  struct Served {
    int64_t version = 0;
    int64_t shard_incarnation = 0;
  };
  AttemptEnd Pull(grpc::ClientContext* context, absl::Span<float> values, int64_t after_sequence,
                  ValuesSeen seen, const Attempter& attempt, Served* served);
  // One attempt at pushing the shard's part `values`, computed from `base` (a version of the
  // process `base.shard_incarnation`, 0: this one), as `sequence`; `filling`, if not null, says
  // how far the values are final, and `compressed_once` is the push's place for the part's
  // compressed bytes (client/tensor_path.h).
  AttemptEnd Push(grpc::ClientContext* context, absl::Span<const float> values, int64_t sequence,
                  Served base, FillProgress* filling,
                  std::shared_ptr<const CompressedTensor>* compressed_once,
                  const Attempter& attempt, PushDone* done);
  // The paths a part takes now, in fallback order: shared memory or the data plane (null where
  // there is none), and gRPC to the replica called now (always).
  struct Paths {
    std::shared_ptr<SharedMemoryPath> shared;
    std::shared_ptr<DataPlanePath> data;
    GrpcPath* rpc;
  };
  Paths paths() const;
  // Whether a push part may go as its values come: over the data plane, uncompressed, as float32
  // (the caller checks the type).
  bool StreamsPush() const;
  // Asks for shared memory, else a data-plane connection, again, on a thread of the client's, if
  // there is neither and the retry is due; calls meanwhile go over gRPC.
  void RetryPaths(const Attempter& attempt);
  // Ends the data-plane connection (CancelPending): calls waiting on it fail at once.
  void EndData();

 private:
  // One attempt of `fn` on the first path that takes it; a path lost is dropped (later attempts
  // take the next), a data-plane connection this client cut (a push dropped midway) replaced.
  AttemptEnd OnPaths(grpc::ClientContext* context,
                     const std::function<AttemptEnd(TensorPath&, const PathCall&)>& fn,
                     const Attempter& attempt);
  // The data-plane path if it is with the replica called now, else null.
  std::shared_ptr<DataPlanePath> DataNow() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A path for this process (`incarnation`) with shard process `shard_incarnation`.
  absl::StatusOr<std::shared_ptr<SharedMemoryPath>> AttachSharedMemory(int64_t incarnation,
                                                                       int64_t shard_incarnation,
                                                                       const Attempter& attempt);
  absl::StatusOr<std::shared_ptr<DataPlanePath>> ConnectDataPlane(int64_t incarnation,
                                                                  int64_t shard_incarnation,
                                                                  const Attempter& attempt);
  // Stops using `path` (it failed: `why`); later calls take the next path.
  void Drop(const TensorPath* path, absl::string_view why);
  // Puts a new data-plane connection in the place of `data`, whose connection this client ended
  // itself; drops it if none can be made.
  void RenewData(const std::shared_ptr<DataPlanePath>& data, const Attempter& attempt);
  // After a path was lost or could not be had (`why`): whether to ask again and when.
  void ScheduleRetry(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string address() const { return current_replica().address; }

  // The first wait before a path is asked for again; it doubles up to the last.
  static constexpr absl::Duration kRetryFirst = absl::Milliseconds(100);
  static constexpr absl::Duration kRetryLast = absl::Seconds(10);

  const int index_;
  const Range range_;
  const Client client_;
  std::vector<std::unique_ptr<Replica>> replicas_;
  // What the client compresses (neither: no decorator around the paths).
  CompressedPath::Compression compression_;
  // Held while registering again, so that two threads noticing one restart do not register
  // twice (the second registration would supersede the first).
  absl::Mutex register_mu_;
  mutable absl::Mutex mu_;
  int current_ ABSL_GUARDED_BY(mu_) = 0;
  State state_ ABSL_GUARDED_BY(mu_);
  int reregistrations_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<SharedMemoryPath> shared_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<DataPlanePath> data_ ABSL_GUARDED_BY(mu_);
  // Without `shared_` or `data_` where the shard may give one (refused a place, a path lost):
  // when to ask again (InfiniteFuture: not to, or an attempt is under way), and the wait after a
  // further failure.
  absl::Time retry_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Duration backoff_ ABSL_GUARDED_BY(mu_) = kRetryFirst;
};

}  // namespace ps
