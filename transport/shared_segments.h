// The shared-memory segments a shard has handed to clients on its host (transport/shared_memory.h),
// each sized for the shard's whole range in float32 in each direction. At most `max_segments` at
// once (each costs up to 2 x the shard's bytes once used), one per worker id (attaching again
// replaces that worker's; observers each get their own). When all are taken, the one used longest
// ago is freed for a new one if no call has used it for `idle`. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/shared_memory.h"

namespace ps {

class SharedSegments {
 public:
  // max_segments 0: shared memory is off (Attach fails with FAILED_PRECONDITION).
  SharedSegments(int max_segments, int64_t region_bytes, absl::Duration idle = absl::Minutes(2));

  struct Attached {
    int64_t id = 0;  // random, never 0: requests name the segment by it
    std::shared_ptr<const SharedSegment> segment;
  };
  // A new segment for the client `owner` (a worker id, or negative for an observer).
  // RESOURCE_EXHAUSTED when every place is taken by a segment in use.
  absl::StatusOr<Attached> Attach(int owner);
  // Segment `id`, if `owner` attached it and it is still held (NOT_FOUND otherwise). Holding the
  // result keeps it from being freed; it counts as used now.
  absl::StatusOr<std::shared_ptr<const SharedSegment>> Find(int64_t id, int owner);
  // Frees worker `owner`'s segment (it left); its calls in progress keep theirs until they end.
  void Release(int owner);
  // Gives back the memory of segments no call has used for `unused` (their idle regions; the
  // next call takes pages again), so that a shard at rest holds no shared memory.
  void Trim(absl::Time now, absl::Duration unused);

  int max_segments() const { return max_segments_; }
  int size() const;

 private:
  struct Entry {
    int owner;
    std::shared_ptr<const SharedSegment> segment;
    absl::Time last_used;
    bool trimmed = false;  // since it was last used
  };
  // True if there is room for one more segment, after freeing the least recently used one if
  // that was idle for idle_ and no call holds it.
  bool MakeRoom() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLocked(int owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_segments_;
  const int64_t region_bytes_;
  const absl::Duration idle_;
  mutable absl::Mutex mu_;
  std::map<int64_t, Entry> segments_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps
