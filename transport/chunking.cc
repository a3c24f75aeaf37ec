#include "transport/chunking.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace ps {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "wire format is little-endian floats");

std::string_view AsBytes(absl::Span<const float> values) {
  return std::string_view(reinterpret_cast<const char*>(values.data()),
                          values.size() * sizeof(float));
}

absl::StatusOr<PayloadFormat> PushPayloadFormat(int dtype, int64_t topk_pairs, int64_t length) {
  PayloadFormat format;
  if (dtype == static_cast<int>(Compressor::kOneBit) || dtype == static_cast<int>(Compressor::kInt8) ||
      dtype == static_cast<int>(Compressor::kTopK)) {
    format.compressor = static_cast<Compressor>(dtype);
  } else {
    absl::StatusOr<WireType> type = WireTypeOfDType(dtype);
    if (!type.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unsupported dtype ", dtype, ": expected FLOAT32, BFLOAT16, FLOAT16, ONEBIT, TOPK or INT8"));
    }
    format.type = *type;
  }
  if (format.compressor != Compressor::kTopK) {
    if (topk_pairs != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("topk_pairs is ", topk_pairs, " in a push that is not TOPK"));
    }
    return format;
  }
  if (length >= (int64_t{1} << 32)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a TOPK push covers fewer than 2^32 values, not ", length));
  }
  if (topk_pairs < 0 || topk_pairs > length) {
    return absl::InvalidArgumentError(absl::StrCat("a TOPK push of ", length,
                                                   " values declares ", topk_pairs, " pairs"));
  }
  format.topk_pairs = topk_pairs;
  return format;
}

int64_t PayloadBytes(const PayloadFormat& format, int64_t n) {
  if (format.compressor != Compressor::kNone) {
    return CompressedBytes(format.compressor, n, format.topk_pairs);
  }
  return n * WireBytes(format.type);
}

ChunkAssembler::ChunkAssembler(absl::Span<float> destination, const PayloadFormat& format)
    : dst_(destination), type_(format.type) {
  if (format.compressor != Compressor::kNone) {
    compressed_.emplace(format.compressor, format.topk_pairs, destination);
  }
}

int64_t ChunkAssembler::received() const {
  return compressed_ ? compressed_->received() : received_;
}

size_t ChunkAssembler::element_bytes() const {
  return compressed_ ? compressed_->unit_bytes() : WireBytes(type_);
}

absl::Status ChunkAssembler::Append(std::string_view bytes) {
  if (compressed_) return compressed_->Append(bytes);
  const int width = WireBytes(type_);
  if (bytes.size() % width != 0) {
    return absl::InvalidArgumentError(absl::StrCat("chunk of ", bytes.size(),
                                                   " bytes is not a whole number of ",
                                                   WireTypeName(type_), " values"));
  }
  int64_t n = bytes.size() / width;
  if (received_ + n > static_cast<int64_t>(dst_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data overruns the declared length: ", received_ + n, " values for ", dst_.size()));
  }
  // An empty span or string_view may hold null, which memcpy must not get even for 0 bytes.
  if (n > 0) DecodeValues(bytes, type_, dst_.subspan(received_, n));
  received_ += n;
  return absl::OkStatus();
}

absl::Status ChunkAssembler::Finish() const {
  if (compressed_) return compressed_->Finish();
  if (received_ != static_cast<int64_t>(dst_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncated data: got ", received_, " values, declared ", dst_.size()));
  }
  return absl::OkStatus();
}

}  // namespace ps
