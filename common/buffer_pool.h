// Reusable float buffers, so that large pushes and pulls do not allocate (and page-fault) fresh
// memory on every call: glibc hands big allocations to mmap, and touching fresh pages costs more
// than moving the bytes. Thread-safe.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace ps {

class BufferPool {
 public:
  // A buffer borrowed from a pool, returned to it on destruction. Contents start unspecified.
  class Lease {
   public:
    Lease(Lease&& o) noexcept
        : pool_(o.pool_), data_(std::move(o.data_)), capacity_(o.capacity_), size_(o.size_) {}
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    absl::Span<float> span() const { return absl::Span<float>(data_.get(), size_); }

   private:
    friend class BufferPool;
    Lease(BufferPool* pool, std::unique_ptr<float[]> data, size_t capacity, size_t size)
        : pool_(pool), data_(std::move(data)), capacity_(capacity), size_(size) {}
    BufferPool* pool_;
    std::unique_ptr<float[]> data_;
    size_t capacity_, size_;
  };

  // Keeps at most `max_idle` buffers between uses (one per concurrent request is plenty).
  explicit BufferPool(size_t max_idle = 8) : max_idle_(max_idle) {}

  // A buffer of `size` floats: an idle one that is large enough, or a new one.
  Lease Acquire(size_t size);

 private:
  struct Idle {
    std::unique_ptr<float[]> data;
    size_t capacity;
  };
  void Release(std::unique_ptr<float[]> data, size_t capacity);

  const size_t max_idle_;
  absl::Mutex mu_;
  std::vector<Idle> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps
