// ShardedClient's implementation object (client/sharded_client.h), shared by its sources:
// sharded_client.cc (fan-out, sequences, the pending handles: pulls and pushes) and
// control_calls.cc (register, initialise, statistics, checkpoints, heartbeats, leave). Included by
// them only.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "client/shard_attempts.h"
#include "client/shard_call.h"
#include "client/shard_session.h"
#include "client/sharded_client.h"
#include "common/compression.h"
#include "proto/ps.grpc.pb.h"

namespace ps {

// Everything the client knows and holds: channels, sessions, the retry loop, the threads.
class ShardedClient::Impl {
 public:
  using ShardFn = ShardAttempts::ShardFn;
  Impl(std::vector<std::string> addresses, ModelIdentity model, int worker_id,
       ClientOptions options);

  int num_shards() const { return static_cast<int>(sessions_.size()); }

  // Starts fn(shard) for every shard, each on a CallThreads thread, retrying transient failures
  // (the one retry loop); the call reports the first error, prefixed with the shard's address.
  // `on_end`: see Call. kHeld: each shard starts at the call's Send (CancelPending and Close
  // abandon those not sent). kLastHere: returns once the last shard's part, run on this thread,
  // ended.
  // `budget_from(shard)`, if given: a time from which shard's retry budget counts when later
  // than its first attempt (a part sent as backward makes it: once backward finished it).
  std::shared_ptr<Call> Start(ShardFn fn, bool retry, absl::Duration timeout,
                              std::function<void()> on_end = nullptr, Launch launch = Launch::kNow,
                              std::function<void(int)> on_part = nullptr,
                              std::function<absl::Time(int)> budget_from = nullptr);
  absl::Status ForEachShard(ShardFn fn, bool retry, absl::Duration timeout) {
    return Start(std::move(fn), retry, timeout, nullptr, Launch::kLastHere)->Wait();
  }
  absl::Status ForEachShard(ShardFn fn) {
    return ForEachShard(std::move(fn), /*retry=*/true, options_.rpc_timeout);
  }
  v1::ModelIdentity ModelProto() const;

  // The shard's replica calls go to now: its stub and its address.
  v1::ParameterServer::Stub* Stub(int shard) const;
  std::string Address(int shard) const;
  // Register, Initialize and Stats of the class.
  absl::StatusOr<int64_t> Register();
  absl::StatusOr<int> Initialize(absl::Span<const float> params);
  absl::StatusOr<std::vector<v1::StatsResponse>> Stats();
  // One unary `call` with `request` to every shard, retried like the others; the answers by shard.
  template <typename Request, typename Response>
  absl::StatusOr<std::vector<Response>> CallEachShard(
      grpc::Status (v1::ParameterServer::Stub::*call)(grpc::ClientContext*, const Request&,
                                                      Response*),
      const Request& request) {
    std::vector<Response> out(num_shards());
    absl::Status s = ForEachShard([&](int shard, grpc::ClientContext* context) {
      return AttemptEnd::FromShard((Stub(shard)->*call)(context, request, &out[shard]));
    });
    if (!s.ok()) return s;
    return out;
  }
  // Sends every shard `call` (Heartbeat, Leave) with this worker's identity: one attempt each.
  template <typename Request, typename Response>
  absl::Status TellEachShard(absl::Duration timeout,
                             grpc::Status (v1::ParameterServer::Stub::*call)(grpc::ClientContext*,
                                                                             const Request&,
                                                                             Response*)) {
    return ForEachShard(
        [&](int shard, grpc::ClientContext* context) {
          Request request;
          const ShardSession::State session = sessions_[shard]->state();
          request.set_worker_id(worker_id_);
          request.set_incarnation(session.incarnation);
          request.set_shard_incarnation(session.shard_incarnation);
          Response response;
          return AttemptEnd::FromShard((Stub(shard)->*call)(context, request, &response));
        },
        /*retry=*/false, timeout);
  }
  // One attempt at pulling shard `shard`'s range into `params`, recording what it served.
  // `seen`: told of each run of values as it is in place, where they come as a stream (over the
  // data plane or gRPC's; a run is a part of `params`).
  AttemptEnd PullFrom(int shard, grpc::ClientContext* context, absl::Span<float> params,
                      int64_t after_sequence, Versions* versions, ValuesSeen seen);
  // One attempt at pushing shard `shard`'s part of `gradient` (its compressed bytes, where the
  // client compresses, kept in `compressed_once` for the retries). With `fill` (a held push's),
  // the part's values may still be coming: sent as they come where a path takes that, else once
  // all of them are in.
  AttemptEnd PushTo(int shard, grpc::ClientContext* context, absl::Span<const float> gradient,
                    std::shared_ptr<const CompressedTensor>* compressed_once, int64_t sequence,
                    const Versions& base, PushDone* done, PushFill* fill);
  // Whether shard `shard`'s part of a push may go as its values come (Pending::Filled): on a
  // path that sends them so, as float32, uncompressed.
  bool StreamsPush(int shard) const;

  ModelIdentity model_;
  int worker_id_;
  ClientOptions options_;
  std::vector<Range> ranges_;  // shard i's range of the flat vector
  // By shard: the next shard listed on the same host (its first replica's), -1: none. A
  // started pull's parts on one host go one after another, in this order.
  std::vector<int> next_on_host_;
  bool hosts_shared_ = false;  // whether a host holds several shards
  std::string consistency_;

  std::vector<std::unique_ptr<ShardSession>> sessions_;  // by shard
  ShardAttempts attempts_;
  // The worker's pushes and pulls as the client numbers them. Shared with the calls' results,
  // which may outlive the client.
  struct Steps {
    absl::Mutex mu;
    int64_t next ABSL_GUARDED_BY(mu) = 0;                // the next push's sequence
    int64_t last_started ABSL_GUARDED_BY(mu) = -1;       // the last push's
    std::multiset<int64_t> pushing ABSL_GUARDED_BY(mu);  // pushes in progress
    // Whether a push started since the last pull was waited for: a prefetch is then ahead of
    // that push, else of the next one.
    bool pushed_since_pull ABSL_GUARDED_BY(mu) = false;
    Versions last_pull ABSL_GUARDED_BY(mu);
    // For registering again: the push in progress (the lowest), else the next.
    int64_t Resume() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return pushing.empty() ? next : *pushing.begin();
    }
  };
  const std::shared_ptr<Steps> steps_ = std::make_shared<Steps>();

  absl::Mutex mu_;
  std::vector<std::weak_ptr<Call>> holding_ ABSL_GUARDED_BY(mu_);    // calls started kHeld
  std::vector<std::weak_ptr<PushFill>> fills_ ABSL_GUARDED_BY(mu_);  // their pushes' fills

  // Last: destroyed (its threads joined) before the state they use.
  CallThreads threads_;
};

}  // namespace ps
