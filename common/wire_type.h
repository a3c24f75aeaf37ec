// The element types a tensor may travel in. float32 is exact. bfloat16 (float32's sign, 8-bit
// exponent and top 7 mantissa bits) and float16 (IEEE half: 5-bit exponent, 10-bit mantissa, finite
// up to 65504) halve the bytes on the wire; values are rounded to nearest, ties to even. The
// shard keeps and applies float32 whatever travels.
// Conversions run on whole spans, vectorised (float16 with the CPU's F16C instructions where it
// has them, checked at run time). Thread-safe (pure functions).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ps {

// The numbers are ps.v1.DType's.
enum class WireType { kFloat32 = 1, kBFloat16 = 2, kFloat16 = 3 };

// The wire type of a ps.v1.DType number; INVALID_ARGUMENT for any other.
absl::StatusOr<WireType> WireTypeOfDType(int dtype);

// "fp32", "bf16" or "fp16"; INVALID_ARGUMENT naming the choices otherwise.
absl::StatusOr<WireType> ParseWireType(absl::string_view name);
const char* WireTypeName(WireType type);
// Bytes per element on the wire: 4 or 2.
int WireBytes(WireType type);

// Writes `values` as `type` into `out` (values.size() * WireBytes(type) bytes; resized). A finite
// value beyond the type's largest is saturated to it rather than turned into an infinity (a shard
// refuses non-finite gradients); returns how many were. NaN and infinities stay what they are.
int64_t EncodeValues(absl::Span<const float> values, WireType type, std::string* out);
// The same into `out`, which must hold values.size() * WireBytes(type) bytes.
int64_t EncodeValues(absl::Span<const float> values, WireType type, char* out);
// Reads bytes.size() / WireBytes(type) values of `type` into `dst`, which must hold exactly that
// many (the caller checks).
void DecodeValues(std::string_view bytes, WireType type, absl::Span<float> dst);

}  // namespace ps
