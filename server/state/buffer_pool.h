// Reusable float buffers, so that large pushes and pulls do not allocate (and page-fault) fresh
// memory on every call: glibc hands big allocations to mmap, and touching fresh pages costs more
// than moving the bytes. Idle buffers cost memory, though (a shard's buffers are shard-sized), so
// the owner trims those left unused for a while. Thread-safe.
#pragma once

#include <cstddef>
#include <memory>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace ps {

class BufferPool {
 public:
  // A buffer borrowed from a pool, returned to it on destruction. Contents start unspecified.
  // It may outlive the pool (gRPC may release a buffer it sends after the pool's owner is gone):
  // the buffer is then freed.
  class Lease {
   public:
    Lease() : capacity_(0), size_(0) {}  // no buffer: an empty span
    Lease(Lease&& o) noexcept
        : pool_(std::move(o.pool_)),
          data_(std::move(o.data_)),
          capacity_(o.capacity_),
          size_(o.size_) {}
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    absl::Span<float> span() const { return absl::Span<float>(data_.get(), size_); }

   private:
    friend class BufferPool;
    struct Shared;
    Lease(std::shared_ptr<Shared> pool, std::unique_ptr<float[]> data, size_t capacity, size_t size)
        : pool_(std::move(pool)), data_(std::move(data)), capacity_(capacity), size_(size) {}
    std::shared_ptr<Shared> pool_;
    std::unique_ptr<float[]> data_;
    size_t capacity_, size_;
  };

  // Keeps at most `max_idle` buffers between uses (one per concurrent request is plenty).
  explicit BufferPool(size_t max_idle = 8);

  // A buffer of `size` floats: an idle one that is large enough, or a new one.
  Lease Acquire(size_t size);
  // Frees the idle buffers that have not been used for `unused` or longer (at `now`).
  void Trim(absl::Duration unused, absl::Time now = absl::Now());
  // Bytes held by idle buffers.
  size_t IdleBytes() const;

 private:
  std::shared_ptr<Lease::Shared> shared_;  // the idle buffers, shared with the leases
};

}  // namespace ps
