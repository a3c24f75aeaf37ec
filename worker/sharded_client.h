// The worker-side view of the parameter servers: one flat parameter vector split over S shards.
// Pull and Push fan out to all shards concurrently; every call has a deadline, and calls that
// failed for a transient reason (UNAVAILABLE, DEADLINE_EXCEEDED) are retried with backoff. Retrying
// is safe: pulls are reads, pushes carry a (worker, sequence) id that a shard applies once.
// Not thread-safe: one thread drives a client.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/model_identity.h"
#include "common/partition.h"
#include "proto/ps.grpc.pb.h"

namespace ps {

struct ClientOptions {
  absl::Duration rpc_timeout = absl::Seconds(10);  // deadline of each attempt
  absl::Duration retry_for = absl::Seconds(60);    // give up after transient failures this long
};

class ShardedClient {
 public:
  // `model.num_shards` must equal addresses.size(). worker_id < 0 makes an observer, which may
  // pull but not push.
  ShardedClient(std::vector<std::string> addresses, ModelIdentity model, int worker_id,
                ClientOptions options = {});

  int num_shards() const { return static_cast<int>(stubs_.size()); }
  const ModelIdentity& model() const { return model_; }

  // Registers with every shard (checking they agree on the model) and returns the sequence number
  // this worker's next push should carry: one past the last any shard applied from it.
  absl::StatusOr<int64_t> Register();

  // Offers initial values to every shard. Shards already initialised keep their values, so a
  // restarted initialiser never resets a trained model. Returns how many shards took the values.
  absl::StatusOr<int> Initialize(absl::Span<const float> params);

  // Fills `params` (total_params floats) from all shards, waiting for initialisation if needed.
  // versions[i] gets shard i's version.
  absl::Status Pull(absl::Span<float> params, std::vector<int64_t>* versions);

  struct PushSummary {
    int64_t max_staleness = 0;  // over shards
    int duplicates = 0;         // shards that had applied this sequence before
  };
  // Pushes each shard its slice of `gradient`, tagged with `sequence` and the version of that
  // shard the gradient was computed from.
  absl::StatusOr<PushSummary> Push(absl::Span<const float> gradient, int64_t sequence,
                                   const std::vector<int64_t>& base_versions);

  // Every shard's statistics.
  absl::StatusOr<std::vector<v1::StatsResponse>> Stats();

 private:
  // Runs fn(shard) for every shard concurrently, retrying transient failures; returns the first
  // error, prefixed with the shard's address.
  absl::Status ForEachShard(const std::function<grpc::Status(int shard, grpc::ClientContext*)>& fn);
  v1::ModelIdentity ModelProto() const;

  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<v1::ParameterServer::Stub>> stubs_;
  ModelIdentity model_;
  int worker_id_;
  ClientOptions options_;
  std::vector<Range> ranges_;  // shard i's range of the flat vector
};

}  // namespace ps
