// Compressed tensors: gradients of pushes, and the change a compressed pull sends (the shard's
// side of it: server/rpc/pull_views.h). A worker may send its gradient as
//   onebit  per block of 256 values, a sign bit each and one scale, the block's mean |value|:
//           each value becomes +-scale (1-bit SGD, Seide et al. 2014); about 28x fewer bytes;
//   topk:F  the fraction F of the values largest in magnitude, as (index, value) pairs, every
//           other value 0 (Stich et al. 2018); 8 bytes a pair, so 50x fewer bytes at F = 0.01;
//   int8    per block of 256 values, a scale = max |value| / 127 and an int8 q each, rounded to
//           nearest: each value becomes q * scale; about 3.9x fewer bytes.
// Each loses part of the gradient; a worker keeps that part and adds it to its next push (error
// feedback: client/push_compressor.h). A shard decodes the payload into its float32 gradient
// buffer (ChunkAssembler, transport/chunking.h, which uses CompressedDecoder) and applies it as any
// other. A pull's change is compressed and decoded the same way, over gRPC only.
//
// Wire formats (ps.v1.DType ONEBIT, TOPK, INT8; little-endian) of n values:
//   ONEBIT  blocks of kCompressionBlock values, the last with m <= 256: a float32 scale (finite,
//           >= 0), then ceil(m/8) bytes of signs, value i's in bit i%8 of byte i/8 (set: +scale,
//           clear: -scale, the sign of -0 included; spare bits of the last byte are ignored).
//   INT8    blocks likewise: a float32 scale (finite, >= 0), then m int8 q, value = q * scale.
//   TOPK    P pairs (P in PushHeader.topk_pairs): a uint32 index in [0, n), strictly increasing
//           (so never repeated), then a float32 value.
// A stream of chunks cuts the payload at whole units (a block, a pair: ForEachUnitChunk in
// chunking.h), so every message holds whole units and only the payload's last block is short.
//
// Functions are thread-safe (pure); a CompressedDecoder decodes one payload and is not.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ps {

// The numbers are ps.v1.DType's (kNone: not compressed).
enum class Compressor { kNone = 0, kOneBit = 4, kTopK = 5, kInt8 = 6 };

struct Compression {
  Compressor compressor = Compressor::kNone;
  double topk_fraction = 0;  // kTopK: the fraction of a shard's values sent, in (0, 1]
};

// "none", "onebit", "int8" or "topk:F" with F in (0, 1]; INVALID_ARGUMENT naming the choices.
absl::StatusOr<Compression> ParseCompression(absl::string_view name);
// The name ParseCompression takes ("topk:0.01").
std::string CompressionName(const Compression& compression);

inline constexpr int64_t kCompressionBlock = 256;

// A compressed tensor, as it travels.
struct CompressedTensor {
  Compressor compressor = Compressor::kNone;
  int64_t pairs = 0;  // kTopK: the (index, value) pairs in `bytes`
  std::string bytes;
};

// Compresses `values` into `*out` (its bytes reused) and leaves in `values` what the compression
// lost: values - decode(*out), which error feedback keeps. kTopK sends max(1, round(F * n))
// values (none of none); ties in magnitude go to the lower index. A non-finite value makes its
// block's scale (top-k: its pair) non-finite, which a shard refuses.
// REQUIRES: compression.compressor != kNone; for kTopK, values.size() < 2^32.
void Compress(const Compression& compression, absl::Span<float> values, CompressedTensor* out);

// Bytes of the unit a payload of `compressor` is cut into: a whole block, or a pair.
int64_t CompressedUnitBytes(Compressor compressor);
// The exact bytes of a payload of n values (for kTopK, of `pairs` pairs).
int64_t CompressedBytes(Compressor compressor, int64_t n, int64_t pairs);

// Decodes one compressed payload of dst.size() values, fed in pieces of whole units, into dst.
class CompressedDecoder {
 public:
  // `pairs`: kTopK's declared count, in [0, dst.size()]; dst is zeroed then (the values no pair
  // names). REQUIRES: compressor != kNone, and for kTopK dst.size() < 2^32.
  CompressedDecoder(Compressor compressor, int64_t pairs, absl::Span<float> dst);

  // Decodes the next piece. INVALID_ARGUMENT naming the problem, with nothing written, when it is
  // not whole units (only the payload's last block may be short), runs past the payload, holds
  // a scale that is not finite and >= 0, or a top-k index out of range or not above the one
  // before.
  absl::Status Append(std::string_view bytes);
  // OK once the whole payload arrived; otherwise says how much is missing.
  absl::Status Finish() const;

  int64_t unit_bytes() const { return CompressedUnitBytes(compressor_); }
  // How far the payload got: values (pairs for kTopK).
  int64_t received() const { return received_; }

 private:
  absl::Status AppendBlocks(std::string_view bytes);
  absl::Status AppendPairs(std::string_view bytes);

  Compressor compressor_;
  int64_t pairs_;
  absl::Span<float> dst_;
  int64_t received_ = 0;
  int64_t last_index_ = -1;  // kTopK: the last pair's
};

}  // namespace ps
