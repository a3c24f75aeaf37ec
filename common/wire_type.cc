#include "common/wire_type.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

constexpr float kFloat16Max = 65504.0f;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Round to nearest even; NaN stays a (quiet) NaN; a finite value that would round to infinity is
// saturated to bfloat16's largest (counted in *saturated).
// In blocks with a 32-bit count, all lanes 32 bits wide until the store, so that GCC vectorises
// the loop (a 64-bit count of bools kept it scalar: 5x slower).
int64_t ToBFloat16(absl::Span<const float> in, uint16_t* __restrict out) {
  constexpr size_t kBlock = 1 << 20;
  const float* __restrict p = in.data();
  int64_t saturated = 0;
  for (size_t b = 0; b < in.size(); b += kBlock) {
    const size_t e = std::min(in.size(), b + kBlock);
    uint32_t block_saturated = 0;
    for (size_t i = b; i < e; ++i) {
      const uint32_t u = Bits(p[i]);
      const uint32_t magnitude = u & 0x7fffffffu;
      const uint32_t nan = magnitude > 0x7f800000u;
      const uint32_t finite = magnitude < 0x7f800000u;
      uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
      const uint32_t overflow = finite & ((rounded & 0x7f80u) == 0x7f80u);
      block_saturated += overflow;
      rounded = overflow ? ((u >> 16) & 0x8000u) | 0x7f7fu : rounded;
      out[i] = static_cast<uint16_t>(nan ? (u >> 16) | 0x40u : rounded);
    }
    saturated += block_saturated;
  }
  return saturated;
}

// `in` may be unaligned (bytes straight from gRPC's slices): read through memcpy.
uint16_t Half(const char* in, size_t i) {
  uint16_t h;
  std::memcpy(&h, in + 2 * i, sizeof(h));
  return h;
}

void FromBFloat16(const char* in, absl::Span<float> out) {
  for (size_t i = 0; i < out.size(); ++i) {
    uint32_t u = static_cast<uint32_t>(Half(in, i)) << 16;
    std::memcpy(&out[i], &u, sizeof(u));
  }
}

// Clamps finite values to float16's range first (counted), so that none becomes an infinity.
// Written, like ToBFloat16, for GCC to vectorise (no short-circuit, a 32-bit count).
int64_t Saturate(absl::Span<const float> in, float* __restrict out) {
  const float* __restrict p = in.data();
  uint32_t saturated = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const float v = p[i];
    const float a = std::fabs(v);
    const uint32_t over = (a > kFloat16Max) & (a <= std::numeric_limits<float>::max());
    saturated += over;
    out[i] = over ? std::copysign(kFloat16Max, v) : v;
  }
  return saturated;
}

__attribute__((target("avx,f16c"))) void ToFloat16F16c(const float* in, size_t n, uint16_t* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = _cvtss_sh(in[i], _MM_FROUND_TO_NEAREST_INT);
}

__attribute__((target("avx,f16c"))) void FromFloat16F16c(const char* in, size_t n, float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = _cvtsh_ss(Half(in, i));
}

// Without F16C: the compiler's half-precision conversions (round to nearest even). _Float16 where
// the compiler has it (GCC 12, clang 15); clang 14, which tools/check_thread_safety.py parses
// with, has only the storage type __fp16 on x86 (converted through float: the same results).
#ifdef __FLT16_MAX__
using Half16 = _Float16;
#else
using Half16 = __fp16;
#endif

void ToFloat16Portable(const float* in, size_t n, uint16_t* out) {
  for (size_t i = 0; i < n; ++i) {
    Half16 h = static_cast<Half16>(in[i]);
    std::memcpy(&out[i], &h, sizeof(h));
  }
}

void FromFloat16Portable(const char* in, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    Half16 h;
    std::memcpy(&h, in + 2 * i, sizeof(h));
    out[i] = static_cast<float>(h);
  }
}

bool HasF16c() {
  // F16C from CPUID (clang 14's __builtin_cpu_supports does not know "f16c"); "avx" also says
  // the OS saves the YMM registers the 8-wide conversions use.
  static const bool has = [] {
    unsigned eax, ebx, ecx, edx;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) &&
           (ecx & bit_F16C) != 0;
  }();
  return has;
}

}  // namespace

absl::StatusOr<WireType> ParseWireType(absl::string_view name) {
  if (name == "fp32") return WireType::kFloat32;
  if (name == "bf16") return WireType::kBFloat16;
  if (name == "fp16") return WireType::kFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown wire type '", name, "': expected fp32, bf16 or fp16"));
}

absl::StatusOr<WireType> WireTypeOfDType(int dtype) {
  if (dtype >= 1 && dtype <= 3) return static_cast<WireType>(dtype);
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported dtype ", dtype, ": expected FLOAT32, BFLOAT16 or FLOAT16"));
}

const char* WireTypeName(WireType type) {
  switch (type) {
    case WireType::kBFloat16:
      return "bf16";
    case WireType::kFloat16:
      return "fp16";
    default:
      return "fp32";
  }
}

int WireBytes(WireType type) { return type == WireType::kFloat32 ? 4 : 2; }

int64_t EncodeValues(absl::Span<const float> values, WireType type, std::string* out) {
  out->resize(values.size() * WireBytes(type));
  return EncodeValues(values, type, out->data());
}

int64_t EncodeValues(absl::Span<const float> values, WireType type, char* out) {
  if (values.empty()) return 0;
  auto* half = reinterpret_cast<uint16_t*>(out);
  switch (type) {
    case WireType::kBFloat16:
      return ToBFloat16(values, half);
    case WireType::kFloat16: {
      // Saturated a block at a time on the stack, then converted.
      int64_t saturated = 0;
      float block[1024];
      for (size_t i = 0; i < values.size(); i += 1024) {
        const size_t n = std::min<size_t>(1024, values.size() - i);
        saturated += Saturate(values.subspan(i, n), block);
        if (HasF16c()) {
          ToFloat16F16c(block, n, half + i);
        } else {
          ToFloat16Portable(block, n, half + i);
        }
      }
      return saturated;
    }
    default:
      std::memcpy(out, values.data(), values.size() * sizeof(float));
      return 0;
  }
}

void DecodeValues(std::string_view bytes, WireType type, absl::Span<float> dst) {
  if (dst.empty()) return;
  const char* half = bytes.data();
  switch (type) {
    case WireType::kBFloat16:
      FromBFloat16(half, dst);
      return;
    case WireType::kFloat16:
      if (HasF16c()) {
        FromFloat16F16c(half, dst.size(), dst.data());
      } else {
        FromFloat16Portable(half, dst.size(), dst.data());
      }
      return;
    default:
      std::memcpy(dst.data(), bytes.data(), dst.size() * sizeof(float));
  }
}

}  // namespace ps
