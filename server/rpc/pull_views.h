// What each worker holds of this shard's values after its last compressed pull (its view), so
// that its next pull sends only the change since then, compressed (common/compression.h):
// two-way compression with error feedback on both sides (DoubleSqueeze, Tang et al. 2019). The
// shard's error feedback is the view itself: a pull sends C(values - view) and the view becomes
// view + decode(C), exactly what the worker computes from the same bytes, so what compression
// left out stays in values - view and goes with a later pull.
//
// Each view has an id, new at every answer, which the worker names in its next pull. A pull
// naming another id (the worker missed an answer, a concurrent pull moved the view on, or this
// process never had its view: it restarted, or took over as primary) gets the whole values
// instead, which start a new view. At most `max_views` views are kept (each a copy of the range):
// beyond that the least recently used one is dropped, and its worker's next pull is whole. A
// change is computed in a reused buffer (two range-sized ones kept idle at most), not a fresh one.
//
// Thread-safe: the pulls of different workers encode side by side, one worker's in turn.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "server/state/buffer_pool.h"
#include "common/compression.h"
#include "common/wire_type.h"

namespace ps {

class PullViews {
 public:
  // `size`: the shard's range, in values. max_views 0: no view is kept (every pull is whole).
  PullViews(int64_t size, int max_views);

  struct Answer {
    uint64_t base = 0;  // nonzero: `change` is to be added to this view (the one the worker named)
    uint64_t view = 0;  // the view the worker holds once it applied the answer; 0: none kept
    CompressedTensor change;  // base != 0: the change, compressed
  };
  // The answer to worker `worker`'s pull of `values` (the shard's range) that names view `held`:
  // the change since that view compressed with `compression`, or (base 0) the whole values, which
  // the caller sends as `type` (the new view is what the worker decodes from them).
  // REQUIRES: values.size() == size, compression.compressor != kNone (for kTopK, size < 2^32).
  Answer Encode(int worker, uint64_t held, absl::Span<const float> values, WireType type,
                const Compression& compression);

  // Drops worker `worker`'s view (it left): its next pull, if any, is whole.
  void Forget(int worker);
  // Views kept now.
  int size() const;

 private:
  struct View {
    absl::Mutex mu;
    uint64_t id ABSL_GUARDED_BY(mu) = 0;  // 0: holds nothing yet
    std::vector<float> values ABSL_GUARDED_BY(mu);
  };

  const int64_t size_;
  const int max_views_;
  mutable absl::Mutex mu_;
  struct Kept {
    std::shared_ptr<View> view;
    int64_t used = 0;  // when last encoded for (clock_)
  };
  std::map<int, Kept> views_ ABSL_GUARDED_BY(mu_);  // by worker
  int64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  BufferPool changes_{2};
};

}  // namespace ps
