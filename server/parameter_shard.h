// One parameter-server shard: the values of one contiguous range of the model's flat parameter
// vector, the optimizer state for it, the version counter, per-worker push sequences and the
// staleness histogram. Knows nothing of gRPC. Thread-safe: all methods may be called concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/model_identity.h"
#include "common/partition.h"
#include "common/staleness_histogram.h"
#include "server/optimizer.h"

namespace ps {

// The header of a push, checked before its payload is accepted.
struct PushHeaderInfo {
  int worker_id = 0;
  int64_t sequence = 0;
  int64_t base_version = 0;
  int64_t offset = 0;
  int64_t length = 0;
};

struct PushOutcome {
  int64_t version = 0;
  int64_t staleness = 0;
  bool duplicate = false;
};

struct Registration {
  int shard_index = 0;
  bool initialized = false;
  Range range;
  int64_t version = 0;
  int64_t last_sequence = -1;
};

struct ShardStats {
  int shard_index = 0;
  int num_shards = 0;
  bool initialized = false;
  Range range;
  int64_t version = 0;
  int64_t pushes_applied = 0;
  int64_t pushes_rejected = 0;
  int64_t pushes_duplicate = 0;
  int64_t pulls = 0;
  int registered_workers = 0;
  std::string model_fingerprint;
  std::string optimizer;
  std::vector<int64_t> staleness_counts;
};

class ParameterShard {
 public:
  // Largest shard accepted (4 GiB of float32), so a bad total_params cannot exhaust memory.
  static constexpr int64_t kMaxShardElements = int64_t{1} << 30;

  // REQUIRES: 0 <= shard_index < num_shards; `optimizer` already validated by MakeOptimizer.
  ParameterShard(int shard_index, int num_shards, OptimizerConfig optimizer);

  // Checks an Initialize header; returns the range the payload must cover.
  absl::StatusOr<Range> CheckInitialize(const ModelIdentity& model, int64_t offset,
                                        int64_t length) const;
  // Sets the shard's values once. Returns true if this call initialised the shard, false if it was
  // already initialised for the same model (nothing changes). Fails on a different model, a range
  // that is not the shard's, or a non-finite value.
  absl::StatusOr<bool> Initialize(const ModelIdentity& model, int64_t offset,
                                  absl::Span<const float> values);

  // Records that `worker_id` takes part, after checking it agrees on the model (if one is set).
  // A negative id is an observer (e.g. the evaluator): checked, not recorded.
  absl::StatusOr<Registration> Register(int worker_id, const ModelIdentity& model);

  // Checks a push header before the payload is read (so no buffer is sized by a bad request).
  absl::Status CheckPushHeader(const PushHeaderInfo& header) const;
  // Applies a gradient for [offset, offset + length). A rejected push changes no weight.
  absl::StatusOr<PushOutcome> Push(const PushHeaderInfo& header, absl::Span<const float> gradient);
  // Counts a push rejected before it reached Push (e.g. a malformed stream).
  void RecordRejectedPush();

  // A copy of some of the shard's values and the version they reflect.
  struct Snapshot {
    int64_t version = 0;
    int64_t offset = 0;  // global offset of values[0]
    std::vector<float> values;
  };
  // Copies [offset, offset + length) (offset 0 and length 0: the whole shard). Waits until the
  // shard is initialised or `deadline` passes (then UNAVAILABLE).
  absl::StatusOr<Snapshot> Read(int64_t offset, int64_t length, absl::Time deadline);

  ShardStats Stats() const;
  // Wakes every waiting Read; they fail with UNAVAILABLE.
  void Shutdown();

 private:
  absl::Status CheckModel(const ModelIdentity& model) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status CheckRange(int64_t offset, int64_t length) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const int shard_index_;
  const int num_shards_;
  const OptimizerConfig optimizer_config_;

  mutable absl::Mutex mu_;
  bool initialized_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  ModelIdentity model_ ABSL_GUARDED_BY(mu_);
  Range range_ ABSL_GUARDED_BY(mu_);
  std::vector<float> weights_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Optimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, int64_t> last_sequence_ ABSL_GUARDED_BY(mu_);  // registered workers
  StalenessHistogram staleness_ ABSL_GUARDED_BY(mu_);
  int64_t pushes_rejected_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pushes_duplicate_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pulls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps
