// A worker's compressed pulls (ClientOptions::pull_compression): by shard, the view of its range
// this client holds (the id the shard knows it by, and the values) and room for a change. A pull
// names its view; the shard answers with the change since then, compressed, or (a first pull, or
// one after a failed or restarted one) the whole values as the pull's dtype; the view becomes
// what was pulled, bit for bit as the shard's copy of it (server/rpc/pull_views.h). Over gRPC
// only: such a pull wraps the gRPC path. Thread-safe (one pull of a shard at a time).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/grpc_path.h"

namespace ps {

class CompressedPulls {
 public:
  CompressedPulls(int shards, Compression compression);
  // One attempt at pulling `part` (its request as any pull's) from shard `shard` through `rpc`;
  // `answer` holds the shard's first chunk when OK.
  AttemptEnd Pull(int shard, PullPart& part, GrpcPath& rpc, grpc::ClientContext* context,
                  v1::PullChunk* answer);

 private:
  struct View {
    absl::Mutex mu;
    uint64_t id ABSL_GUARDED_BY(mu) = 0;  // 0: none
    std::vector<float> values ABSL_GUARDED_BY(mu), change ABSL_GUARDED_BY(mu);
  };
  const Compression compression_;
  std::vector<std::unique_ptr<View>> views_;  // by shard
};

}  // namespace ps
