// Tensor chunking for streaming RPCs: float spans go out as little-endian `bytes` pieces of at most
// kChunkBytes (float32, or a 16-bit wire type: common/wire_type.h; a push may be compressed:
// common/compression.h) and are reassembled, checked and decoded, into a destination float buffer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/compression.h"
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

// Calls fn(bytes) for consecutive pieces of `payload`, each the most whole units of `unit_bytes`
// that fit in kChunkBytes (the last piece: the rest). An empty payload yields one empty piece.
template <typename Fn>
void ForEachUnitChunk(std::string_view payload, int64_t unit_bytes, Fn fn) {
  const size_t piece = std::max<int64_t>(1, kChunkBytes / unit_bytes) * unit_bytes;
  size_t i = 0;
  do {
    fn(payload.substr(i, piece));
    i += piece;
  } while (i < payload.size());
}

// What a payload's bytes are: values of a wire type, or a compressed tensor.
struct PayloadFormat {
  WireType type = WireType::kFloat32;  // when not compressed
  Compressor compressor = Compressor::kNone;
  int64_t topk_pairs = 0;  // kTopK
};
// The format of a push of `length` values as its header declares it (`dtype`, a ps.v1.DType
// number, and `topk_pairs`); INVALID_ARGUMENT naming the problem (an unknown dtype, pairs
// declared for another format or more than `length`, a top-k push of 2^32 values or more).
absl::StatusOr<PayloadFormat> PushPayloadFormat(int dtype, int64_t topk_pairs, int64_t length);
// The exact bytes of a payload of n values.
int64_t PayloadBytes(const PayloadFormat& format, int64_t n);

// Reassembles a stream of byte chunks of a payload into a destination span, in order. Not
// thread-safe.
class ChunkAssembler {
 public:
  explicit ChunkAssembler(absl::Span<float> destination, WireType type = WireType::kFloat32)
      : dst_(destination), type_(type) {}
  // REQUIRES: `format` is one PushPayloadFormat accepts for destination.size() values.
  ChunkAssembler(absl::Span<float> destination, const PayloadFormat& format);

  // Appends one chunk. Fails, naming the problem, if its size is not a whole number of elements
  // or it would run past the destination, or the compressed data is malformed
  // (CompressedDecoder::Append); nothing is written then.
  absl::Status Append(std::string_view bytes);

  // OK once the whole payload (destination.size() values) arrived; otherwise says what is missing.
  absl::Status Finish() const;

  // How far the payload got: values (top-k pairs for a top-k payload).
  int64_t received() const;
  // Bytes of one element of the payload: a value of its wire type, or a compressed unit (a
  // block, of which only the payload's last may be shorter, or a top-k pair).
  size_t element_bytes() const;

 private:
  absl::Span<float> dst_;
  WireType type_;
  int64_t received_ = 0;
  std::optional<CompressedDecoder> compressed_;  // set for a compressed payload
};

}  // namespace ps
