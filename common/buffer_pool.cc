#include "common/buffer_pool.h"

#include <algorithm>

namespace ps {

BufferPool::Lease::~Lease() {
  if (data_ != nullptr) pool_->Release(std::move(data_), capacity_);
}

BufferPool::Lease BufferPool::Acquire(size_t size) {
  {
    absl::MutexLock lock(&mu_);
    // The smallest idle buffer that fits, so that big buffers stay for big requests.
    auto best = idle_.end();
    for (auto it = idle_.begin(); it != idle_.end(); ++it) {
      if (it->capacity >= size && (best == idle_.end() || it->capacity < best->capacity)) best = it;
    }
    if (best != idle_.end()) {
      Idle found = std::move(*best);
      idle_.erase(best);
      return Lease(this, std::move(found.data), found.capacity, size);
    }
  }
  size_t capacity = std::max<size_t>(size, 1);
  return Lease(this, std::unique_ptr<float[]>(new float[capacity]), capacity, size);
}

void BufferPool::Release(std::unique_ptr<float[]> data, size_t capacity) {
  absl::MutexLock lock(&mu_);
  if (idle_.size() < max_idle_) {
    idle_.push_back({std::move(data), capacity});
    return;
  }
  // Full: keep the larger buffers, which are the expensive ones to make.
  auto smallest = std::min_element(idle_.begin(), idle_.end(), [](const Idle& a, const Idle& b) {
    return a.capacity < b.capacity;
  });
  if (smallest->capacity < capacity) *smallest = {std::move(data), capacity};
}

}  // namespace ps
