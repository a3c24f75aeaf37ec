#include "common/compression.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ps {
namespace {

constexpr int64_t kScaleBytes = sizeof(float);
constexpr int64_t kPairBytes = sizeof(uint32_t) + sizeof(float);

const char* Name(Compressor c) {
  switch (c) {
    case Compressor::kOneBit:
      return "onebit";
    case Compressor::kTopK:
      return "topk";
    case Compressor::kInt8:
      return "int8";
    default:
      return "none";
  }
}

// Bytes of a block of m values after its scale.
int64_t BlockDataBytes(Compressor c, int64_t m) {
  return c == Compressor::kOneBit ? (m + 7) / 8 : m;
}

int64_t BlockBytes(Compressor c, int64_t m) { return kScaleBytes + BlockDataBytes(c, m); }

float ReadFloat(const char* p) {
  float f;
  std::memcpy(&f, p, sizeof(f));
  return f;
}

// Scales a block's |values| sum (onebit) or maximum (int8) over m values; a non-finite value
// gives a non-finite scale.
float Scale(Compressor c, const float* v, int64_t m) {
  if (c == Compressor::kOneBit) {
    // In double (256 values near float's largest would overflow a float sum), in 8 lanes so
    // that the additions need not wait for each other.
    double lanes[8] = {};
    int64_t i = 0;
    for (; i + 8 <= m; i += 8) {
      for (int l = 0; l < 8; ++l) lanes[l] += std::fabs(v[i + l]);
    }
    for (; i < m; ++i) lanes[0] += std::fabs(v[i]);
    double sum = 0;
    for (double l : lanes) sum += l;
    return static_cast<float>(sum / static_cast<double>(m));
  }
  float max = 0;
  bool nan = false;
  for (int64_t i = 0; i < m; ++i) {
    const float a = std::fabs(v[i]);
    max = a > max ? a : max;
    nan |= a != a;
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : max / 127.0f;
}

// Rounds to nearest, ties to even, for |x| <= 127 (float's addition rounds so at 2^23 + 2^22):
// unlike std::nearbyint, a loop of it vectorises without SSE4.1.
float RoundToInt(float x) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (x + kMagic) - kMagic;
}

// One block: its scale, then its data; `v` keeps what the block lost. Written for GCC to
// vectorise (no branches on values).
void CompressBlock(Compressor c, float* v, int64_t m, char* out) {
  float scale = Scale(c, v, m);
  // An int8 block of values below ~1e-36 goes as zeros (they stay in `v`): 1 / scale would
  // overflow, and with denormals flushed (server/state/denormals.h) scale would read as 0.
  if (c == Compressor::kInt8 && scale < std::numeric_limits<float>::min()) scale = 0;
  std::memcpy(out, &scale, sizeof(scale));
  char* data = out + kScaleBytes;
  std::memset(data, 0, BlockDataBytes(c, m));
  if (!std::isfinite(scale)) return;  // sent as it is: the shard refuses it
  if (c == Compressor::kOneBit) {
    for (int64_t j = 0; j < (m + 7) / 8; ++j) {
      const int64_t count = std::min<int64_t>(8, m - 8 * j);
      unsigned byte = 0;
      for (int64_t b = 0; b < count; ++b) {
        byte |= static_cast<unsigned>(!std::signbit(v[8 * j + b])) << b;
      }
      data[j] = static_cast<char>(byte);
    }
    for (int64_t i = 0; i < m; ++i) v[i] -= std::copysign(scale, v[i]);
    return;
  }
  if (scale == 0) return;  // every value 0: q = 0 loses nothing
  const float inverse = 1.0f / scale;
  for (int64_t i = 0; i < m; ++i) {
    const float q = std::clamp(RoundToInt(v[i] * inverse), -127.0f, 127.0f);
    data[i] = static_cast<char>(static_cast<int>(q));
    v[i] -= q * scale;
  }
}

// The 8 values of a byte of onebit signs, as +-1.
const std::array<std::array<float, 8>, 256>& SignsOfByte() {
  static const auto* const table = [] {
    auto* t = new std::array<std::array<float, 8>, 256>;
    for (int byte = 0; byte < 256; ++byte) {
      for (int b = 0; b < 8; ++b) (*t)[byte][b] = (byte >> b) & 1 ? 1.0f : -1.0f;
    }
    return t;
  }();
  return *table;
}

void DecodeOneBitBlock(const char* data, float scale, int64_t m, float* out) {
  const auto& signs = SignsOfByte();
  for (int64_t j = 0; j < (m + 7) / 8; ++j) {
    const std::array<float, 8>& s = signs[static_cast<uint8_t>(data[j])];
    const int64_t count = std::min<int64_t>(8, m - 8 * j);
    for (int64_t b = 0; b < count; ++b) out[8 * j + b] = s[b] * scale;
  }
}

void CompressTopK(double fraction, absl::Span<float> v, CompressedTensor* out) {
  const int64_t n = static_cast<int64_t>(v.size());
  const int64_t k =
      n == 0 ? 0 : std::clamp<int64_t>(std::llround(fraction * static_cast<double>(n)), 1, n);
  out->pairs = k;
  out->bytes.resize(k * kPairBytes);
  if (k == 0) return;
  // The k-th largest magnitude (NaN taken as the largest, so that it is sent and refused).
  auto magnitude = [](float x) {
    return x != x ? std::numeric_limits<float>::infinity() : std::fabs(x);
  };
  std::vector<float> m(n);
  for (int64_t i = 0; i < n; ++i) m[i] = magnitude(v[i]);
  std::nth_element(m.begin(), m.begin() + (n - k), m.end());
  const float threshold = m[n - k];
  int64_t ties = k;  // values at the threshold to take, the lowest indices first
  for (int64_t i = n - k; i < n; ++i) ties -= m[i] > threshold;  // the k largest are there
  char* p = out->bytes.data();
  for (int64_t i = 0; i < n; ++i) {
    const float a = magnitude(v[i]);
    if (a < threshold || (a == threshold && ties-- <= 0)) continue;
    const uint32_t index = static_cast<uint32_t>(i);
    std::memcpy(p, &index, sizeof(index));
    std::memcpy(p + sizeof(index), &v[i], sizeof(float));
    p += kPairBytes;
    v[i] = 0;
  }
}

}  // namespace

absl::StatusOr<Compression> ParseCompression(absl::string_view name) {
  if (name == "none") return Compression{};
  if (name == "onebit") return Compression{Compressor::kOneBit};
  if (name == "int8") return Compression{Compressor::kInt8};
  double fraction = 0;
  if (absl::StartsWith(name, "topk:") && absl::SimpleAtod(name.substr(5), &fraction) &&
      fraction > 0 && fraction <= 1) {
    return Compression{Compressor::kTopK, fraction};
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown compression '", name, "': expected none, onebit, int8 or topk:F with F in (0, 1]"));
}

std::string CompressionName(const Compression& compression) {
  if (compression.compressor == Compressor::kTopK) {
    return absl::StrCat("topk:", compression.topk_fraction);
  }
  return Name(compression.compressor);
}

void Compress(const Compression& compression, absl::Span<float> values, CompressedTensor* out) {
  const Compressor c = compression.compressor;
  out->compressor = c;
  out->pairs = 0;
  if (c == Compressor::kTopK) return CompressTopK(compression.topk_fraction, values, out);
  const int64_t n = static_cast<int64_t>(values.size());
  out->bytes.resize(CompressedBytes(c, n, 0));
  char* p = out->bytes.data();
  for (int64_t b = 0; b < n; b += kCompressionBlock) {
    const int64_t m = std::min(kCompressionBlock, n - b);
    CompressBlock(c, values.data() + b, m, p);
    p += BlockBytes(c, m);
  }
}

int64_t CompressedUnitBytes(Compressor compressor) {
  return compressor == Compressor::kTopK ? kPairBytes : BlockBytes(compressor, kCompressionBlock);
}

int64_t CompressedBytes(Compressor compressor, int64_t n, int64_t pairs) {
  if (compressor == Compressor::kTopK) return pairs * kPairBytes;
  const int64_t full = n / kCompressionBlock, last = n % kCompressionBlock;
  return full * BlockBytes(compressor, kCompressionBlock) +
         (last > 0 ? BlockBytes(compressor, last) : 0);
}

CompressedDecoder::CompressedDecoder(Compressor compressor, int64_t pairs, absl::Span<float> dst)
    : compressor_(compressor), pairs_(pairs), dst_(dst) {
  if (compressor_ == Compressor::kTopK) std::fill(dst_.begin(), dst_.end(), 0.0f);
}

absl::Status CompressedDecoder::Append(std::string_view bytes) {
  return compressor_ == Compressor::kTopK ? AppendPairs(bytes) : AppendBlocks(bytes);
}

absl::Status CompressedDecoder::AppendBlocks(std::string_view bytes) {
  const int64_t n = static_cast<int64_t>(dst_.size());
  const int64_t size = static_cast<int64_t>(bytes.size());
  // Checked block by block first (every block is whole but the payload's last, which is short),
  // then decoded.
  int64_t values = 0;
  for (int64_t at = 0; at < size;) {
    const int64_t m = std::min(kCompressionBlock, n - received_ - values);
    if (m == 0) {
      return absl::InvalidArgumentError(absl::StrCat(Name(compressor_),
                                                     " data overruns the declared length of ",
                                                     n, " values"));
    }
    if (size - at < BlockBytes(compressor_, m)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a chunk of ", size, " bytes ends inside a ", Name(compressor_), " block of ",
          BlockBytes(compressor_, m), " bytes: a truncated block"));
    }
    const float scale = ReadFloat(bytes.data() + at);
    if (!(std::isfinite(scale) && scale >= 0)) {
      const int64_t first = received_ + values;
      return absl::InvalidArgumentError(absl::StrCat(Name(compressor_), " block of values [", first,
                                                     ", ", first + m, ") has scale ", scale,
                                                     ": a scale must be finite and >= 0"));
    }
    at += BlockBytes(compressor_, m);
    values += m;
  }
  for (int64_t at = 0, b = 0; b < values; b += kCompressionBlock) {
    const int64_t m = std::min(kCompressionBlock, values - b);
    const float scale = ReadFloat(bytes.data() + at);
    const char* data = bytes.data() + at + kScaleBytes;
    float* out = dst_.data() + received_ + b;
    if (compressor_ == Compressor::kOneBit) {
      DecodeOneBitBlock(data, scale, m, out);
    } else {
      for (int64_t i = 0; i < m; ++i) out[i] = static_cast<int8_t>(data[i]) * scale;
    }
    at += BlockBytes(compressor_, m);
  }
  received_ += values;
  return absl::OkStatus();
}

absl::Status CompressedDecoder::AppendPairs(std::string_view bytes) {
  if (bytes.size() % kPairBytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a chunk of ", bytes.size(), " bytes is not whole top-k pairs (",
                     kPairBytes, " bytes each: a uint32 index and a float32 value)"));
  }
  const int64_t count = static_cast<int64_t>(bytes.size()) / kPairBytes;
  if (received_ + count > pairs_) {
    return absl::InvalidArgumentError(absl::StrCat("top-k data overruns the declared pairs: ",
                                                   received_ + count, " pairs for ", pairs_));
  }
  auto index_at = [&](int64_t j) {
    uint32_t index;
    std::memcpy(&index, bytes.data() + j * kPairBytes, sizeof(index));
    return static_cast<int64_t>(index);
  };
  const int64_t n = static_cast<int64_t>(dst_.size());
  int64_t last = last_index_;
  for (int64_t j = 0; j < count; ++j) {
    const int64_t index = index_at(j);
    if (index >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("top-k index ", index, " is out of range [0, ", n, ")"));
    }
    if (index <= last) {
      return absl::InvalidArgumentError(absl::StrCat(
          "top-k index ", index, " follows index ", last,
          ": indices must be strictly increasing (an index may appear once)"));
    }
    last = index;
  }
  for (int64_t j = 0; j < count; ++j) {
    dst_[index_at(j)] = ReadFloat(bytes.data() + j * kPairBytes + sizeof(uint32_t));
  }
  last_index_ = last;
  received_ += count;
  return absl::OkStatus();
}

absl::Status CompressedDecoder::Finish() const {
  if (compressor_ == Compressor::kTopK) {
    if (received_ != pairs_) {
      return absl::InvalidArgumentError(
          absl::StrCat("truncated top-k data: got ", received_, " pairs, declared ", pairs_));
    }
    return absl::OkStatus();
  }
  if (received_ != static_cast<int64_t>(dst_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("truncated ", Name(compressor_), " data: got ",
                                                   received_, " values, declared ", dst_.size()));
  }
  return absl::OkStatus();
}

}  // namespace ps
