#include "client/push_compressor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ps {

PushCompressor::PushCompressor(Compression compression, bool error_feedback,
                               std::vector<int64_t> part_sizes)
    : compression_(compression), error_feedback_(error_feedback), part_sizes_(std::move(part_sizes)) {
  for (size_t i = 0; i < part_sizes_.size(); ++i) parts_.push_back(std::make_unique<Part>());
}

absl::StatusOr<std::shared_ptr<const CompressedTensor>> PushCompressor::Compress(
    int shard, absl::Span<const float> part) {
  if (compression_.compressor == Compressor::kTopK && part_sizes_[shard] >= (int64_t{1} << 32)) {
    return absl::InvalidArgumentError(
        absl::StrCat("top-k compresses a shard's part of fewer than 2^32 values, not ",
                     part_sizes_[shard], ": use more shards"));
  }
  auto out = std::make_shared<CompressedTensor>();
  Part& p = *parts_[shard];
  absl::MutexLock lock(&p.mu);
  // Made at the first part, so that a client that never pushes holds no residual.
  p.values.resize(part_sizes_[shard]);
  if (error_feedback_) {
    for (size_t i = 0; i < part.size(); ++i) p.values[i] += part[i];  // e = r + g
  } else {
    std::copy(part.begin(), part.end(), p.values.begin());
  }
  ps::Compress(compression_, absl::MakeSpan(p.values), out.get());  // leaves r = e - decode(c)
  return out;
}

std::vector<float> PushCompressor::Residual(int shard) const {
  Part& p = *parts_[shard];
  absl::MutexLock lock(&p.mu);
  if (!error_feedback_ || p.values.empty()) return std::vector<float>(part_sizes_[shard], 0.0f);
  return p.values;
}

}  // namespace ps
