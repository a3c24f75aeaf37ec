#include "server/state/buffer_pool.h"

#include <algorithm>
#include <iterator>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ps {

// The idle buffers, kept alive by the pool and by every lease.
struct BufferPool::Lease::Shared {
  struct Idle {
    std::unique_ptr<float[]> data;
    size_t capacity;
    absl::Time since;  // idle since
  };
  explicit Shared(size_t max) : max_idle(max) {}
  void Release(std::unique_ptr<float[]> data, size_t capacity);

  const size_t max_idle;
  absl::Mutex mu;
  std::vector<Idle> idle ABSL_GUARDED_BY(mu);
};

void BufferPool::Lease::Shared::Release(std::unique_ptr<float[]> data, size_t capacity) {
  absl::MutexLock lock(&mu);
  const absl::Time now = absl::Now();
  if (idle.size() < max_idle) {
    idle.push_back({std::move(data), capacity, now});
    return;
  }
  // Full: keep the larger buffers, which are the expensive ones to make.
  auto smallest = std::min_element(idle.begin(), idle.end(), [](const Idle& a, const Idle& b) {
    return a.capacity < b.capacity;
  });
  if (smallest->capacity < capacity) *smallest = {std::move(data), capacity, now};
}

BufferPool::BufferPool(size_t max_idle) : shared_(std::make_shared<Lease::Shared>(max_idle)) {}

BufferPool::Lease::~Lease() {
  if (data_ != nullptr) pool_->Release(std::move(data_), capacity_);
}

void BufferPool::Trim(absl::Duration unused, absl::Time now) {
  std::vector<Lease::Shared::Idle> freed;  // freed after the lock is released
  absl::MutexLock lock(&shared_->mu);
  std::vector<Lease::Shared::Idle>& idle = shared_->idle;
  auto old = std::stable_partition(idle.begin(), idle.end(), [&](const Lease::Shared::Idle& b) {
    return now - b.since < unused;
  });
  std::move(old, idle.end(), std::back_inserter(freed));
  idle.erase(old, idle.end());
}

size_t BufferPool::IdleBytes() const {
  absl::MutexLock lock(&shared_->mu);
  size_t bytes = 0;
  for (const Lease::Shared::Idle& b : shared_->idle) bytes += b.capacity * sizeof(float);
  return bytes;
}

BufferPool::Lease BufferPool::Acquire(size_t size) {
  {
    absl::MutexLock lock(&shared_->mu);
    std::vector<Lease::Shared::Idle>& idle = shared_->idle;
    // The smallest idle buffer that fits, so that big buffers stay for big requests.
    auto best = idle.end();
    for (auto it = idle.begin(); it != idle.end(); ++it) {
      if (it->capacity >= size && (best == idle.end() || it->capacity < best->capacity)) best = it;
    }
    if (best != idle.end()) {
      Lease::Shared::Idle found = std::move(*best);
      idle.erase(best);
      return Lease(shared_, std::move(found.data), found.capacity, size);
    }
  }
  size_t capacity = std::max<size_t>(size, 1);
  return Lease(shared_, std::unique_ptr<float[]>(new float[capacity]), capacity, size);
}

}  // namespace ps
