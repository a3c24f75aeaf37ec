// A worker's compressed pulls of one shard (ClientOptions::pull_compression): the view of its
// range this client holds (the id the shard knows it by, and the values) and room for a change. A
// pull names its view; the shard answers with the change since then, compressed, or (a first pull,
// or one after a failed or restarted one) the whole values as the pull's dtype; the view becomes
// what was pulled, bit for bit as the shard's copy of it (server/rpc/pull_views.h). Over gRPC
// only (client/compressed_path.h). Thread-safe (one pull at a time).
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
  explicit CompressedPulls(Compression compression) : compression_(compression) {}
  // One attempt at pulling `part` (its request as any pull's) through `rpc`; `answer` holds the
  // shard's first chunk when OK.
  AttemptEnd Pull(PullPart& part, GrpcPath& rpc, grpc::ClientContext* context,
                  v1::PullChunk* answer);

 private:
  struct View {
    absl::Mutex mu;
    uint64_t id ABSL_GUARDED_BY(mu) = 0;  // 0: none
    std::vector<float> values ABSL_GUARDED_BY(mu), change ABSL_GUARDED_BY(mu);
  };
  const Compression compression_;
  View view_;
};

}  // namespace ps
