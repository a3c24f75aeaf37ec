// How far a pull's values are in place, by shard, as they arrive (ShardedClient's
// Pending::WaitValues): a forward pass may start on a layer's weights while the rest of its
// shard's part is still coming. A part's values come from its start, in runs: in order within
// each stripe of the part (transport/data_frames.h), its stripes at once. Values a caller used are
// never rewritten: no attempt at their part starts after that (a retry would bring other values,
// of another version). Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/partition.h"

namespace ps {

class PullFill {
 public:
  // By shard, its part's range of the pull's buffer.
  explicit PullFill(std::vector<Range> ranges);
  const std::vector<Range>& ranges() const { return ranges_; }

  // Shard `shard` may start an attempt at its part: false if values an earlier attempt brought
  // were used.
  bool Attempt(int shard);
  // The attempt at shard `shard`'s part failed: values it brought that were not used count no
  // more (a retry rewrites them). Call after every failed attempt.
  void Failed(int shard);
  // Values [offset, offset + n) of shard `shard`'s part are in place (each value once per
  // attempt).
  void InPlace(int shard, int64_t offset, int64_t n);
  // Shard `shard`'s part ended (it succeeded, or the call gave it up).
  void Ended(int shard);

  enum class Found { kInPlace, kEnded, kTimedOut };
  // Waits up to `timeout` until the first `n` values of shard `shard`'s part are in place (they
  // are used from then on: kInPlace) or the part ended (kEnded: the call's report says how).
  Found WaitFor(int shard, int64_t n, absl::Duration timeout);

 private:
  struct Part {
    int64_t prefix = 0;                // values in place from the part's start
    std::map<int64_t, int64_t> ahead;  // runs in place past a gap: offset -> values
    bool used = false;
    bool ended = false;
  };
  const std::vector<Range> ranges_;
  absl::Mutex mu_;
  std::vector<Part> parts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps
