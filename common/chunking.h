// Tensor chunking for streaming RPCs: float spans go out as little-endian `bytes` pieces of at most
// kChunkBytes (float32, or a 16-bit wire type: common/wire_type.h) and are reassembled, checked and
// decoded, into a destination float buffer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/wire_type.h"

namespace ps {

// 1 MiB: measured as fast as larger chunks on gRPC streams, and far below the 4 MiB receive limit.
inline constexpr int64_t kChunkBytes = 1 << 20;
inline constexpr int64_t kChunkFloats = kChunkBytes / sizeof(float);

// The raw bytes of a float span (the host is little-endian, checked at compile time in the .cc).
std::string_view AsBytes(absl::Span<const float> values);

// Calls fn(first_index, bytes) for consecutive pieces of `values` of at most max_floats each.
// An empty span yields one empty piece so that a stream always carries its header.
template <typename Fn>
void ForEachChunk(absl::Span<const float> values, int64_t max_floats, Fn fn) {
  int64_t i = 0;
  do {
    int64_t n = std::min<int64_t>(max_floats, static_cast<int64_t>(values.size()) - i);
    fn(i, AsBytes(values.subspan(i, n)));
    i += n;
  } while (i < static_cast<int64_t>(values.size()));
}

// Reassembles a stream of byte chunks of `type` values into a destination span, in order. Not
// thread-safe.
class ChunkAssembler {
 public:
  explicit ChunkAssembler(absl::Span<float> destination, WireType type = WireType::kFloat32)
      : dst_(destination), type_(type) {}

  // Appends one chunk. Fails, naming the problem, if its size is not a whole number of values or
  // it would run past the destination; nothing is written then.
  absl::Status Append(std::string_view bytes);

  // OK once exactly destination.size() floats arrived; otherwise says how many are missing.
  absl::Status Finish() const;

  int64_t received() const { return received_; }
  // Bytes per value of its wire type.
  size_t element_bytes() const { return WireBytes(type_); }

 private:
  absl::Span<float> dst_;
  WireType type_;
  int64_t received_ = 0;
};

}  // namespace ps
