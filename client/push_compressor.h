// A worker's compressed pushes (common/compression.h), with error feedback (1-bit SGD, Seide et
// al. 2014; EF-SGD, Karimireddy et al. 2019; top-k, Stich et al. 2018): each shard's part g of a
// push is compressed as e = r + g, where r is what compression left out of that part of the
// earlier pushes (the residual, one float per parameter, kept here); r becomes e - decode(c).
// So nothing a compressor drops is lost, only delayed. Without error feedback g alone is
// compressed and what it drops is lost.
//
// The residual moves once per part compressed: the client compresses a part once per push and
// resends those bytes when an attempt is retried. It lives in this process only: a worker that
// restarts starts from r = 0, and a push that fails for good loses its compressed part (as an
// uncompressed push that fails loses its gradient).
//
// Thread-safe: parts of different shards compress in parallel, parts of one shard one at a time.
#pragma once

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/compression.h"

namespace ps {

class PushCompressor {
 public:
  // `part_sizes`: by shard, the values of its part of a push.
  // REQUIRES: compression.compressor != kNone.
  PushCompressor(Compression compression, bool error_feedback, std::vector<int64_t> part_sizes);

  // Compresses shard `shard`'s part of a push. INVALID_ARGUMENT, with the residual unchanged,
  // for a top-k part of 2^32 values or more (indices travel as uint32).
  // REQUIRES: part.size() is that shard's part size.
  absl::StatusOr<std::shared_ptr<const CompressedTensor>> Compress(int shard,
                                                                   absl::Span<const float> part);

  // Shard `shard`'s residual: zeros before its first part, and always without error feedback.
  std::vector<float> Residual(int shard) const;

 private:
  struct Part {
    absl::Mutex mu;
    // With error feedback, the residual; without, scratch space (its values mean nothing).
    std::vector<float> values ABSL_GUARDED_BY(mu);
  };
  const Compression compression_;
  const bool error_feedback_;
  const std::vector<int64_t> part_sizes_;
  std::vector<std::unique_ptr<Part>> parts_;
};

}  // namespace ps
