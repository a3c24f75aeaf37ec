#include "transport/shared_segments.h"

#include <limits>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"

namespace ps {

SharedSegments::SharedSegments(int max_segments, int64_t region_bytes, absl::Duration idle)
    : max_segments_(max_segments), region_bytes_(region_bytes), idle_(idle) {}

bool SharedSegments::MakeRoom() {
  if (static_cast<int>(segments_.size()) < max_segments_) return true;
  // Full: free the segment used longest ago, if no call holds it and it has been idle long.
  auto oldest = segments_.begin();
  for (auto it = segments_.begin(); it != segments_.end(); ++it) {
    if (it->second.last_used < oldest->second.last_used) oldest = it;
  }
  if (oldest == segments_.end() || oldest->second.segment.use_count() > 1 ||
      absl::Now() - oldest->second.last_used < idle_) {
    return false;
  }
  segments_.erase(oldest);
  return true;
}

absl::StatusOr<SharedSegments::Attached> SharedSegments::Attach(int owner) {
  if (max_segments_ == 0) {
    return absl::FailedPreconditionError("shared memory is off on this shard (ps --shm_clients=0)");
  }
  absl::MutexLock lock(&mu_);
  if (owner >= 0) ReleaseLocked(owner);
  if (!MakeRoom()) {
    return absl::ResourceExhaustedError(absl::StrCat("this shard already shares memory with ",
                                                     max_segments_, " clients (ps --shm_clients)"));
  }
  absl::StatusOr<SharedSegment> created = SharedSegment::Create(region_bytes_);  // microseconds
  if (!created.ok()) return created.status();
  auto segment = std::make_shared<const SharedSegment>(*std::move(created));
  static absl::BitGen random;  // guarded by mu_
  int64_t id = 0;
  while (id == 0 || segments_.count(id) > 0) {
    id = absl::Uniform<int64_t>(random, 1, std::numeric_limits<int64_t>::max());
  }
  segments_[id] = Entry{owner, segment, absl::Now()};
  return Attached{id, std::move(segment)};
}

absl::StatusOr<std::shared_ptr<const SharedSegment>> SharedSegments::Find(int64_t id, int owner) {
  absl::MutexLock lock(&mu_);
  auto it = segments_.find(id);
  if (it == segments_.end() || it->second.owner != owner) {
    return absl::NotFoundError(
        absl::StrCat("no shared memory segment ", id, " of client ", owner,
                     " (freed after it was unused, or the shard restarted)"));
  }
  it->second.last_used = absl::Now();
  it->second.trimmed = false;
  return it->second.segment;
}

void SharedSegments::Release(int owner) {
  absl::MutexLock lock(&mu_);
  ReleaseLocked(owner);
}

void SharedSegments::ReleaseLocked(int owner) {
  for (auto it = segments_.begin(); it != segments_.end();) {
    it = it->second.owner == owner ? segments_.erase(it) : std::next(it);
  }
}

void SharedSegments::Trim(absl::Time now, absl::Duration unused) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, entry] : segments_) {
    if (entry.trimmed || now - entry.last_used < unused) continue;
    // A region a call is using is left alone: the next Trim after that call sees it again.
    const bool push = entry.segment->push().DiscardIfIdle();
    const bool pull = entry.segment->pull().DiscardIfIdle();
    entry.trimmed = push && pull;
  }
}

int SharedSegments::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(segments_.size());
}

}  // namespace ps
