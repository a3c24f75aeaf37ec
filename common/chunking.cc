#include "common/chunking.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace ps {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "wire format is little-endian floats");

std::string_view AsBytes(absl::Span<const float> values) {
  return std::string_view(reinterpret_cast<const char*>(values.data()),
                          values.size() * sizeof(float));
}

absl::Status ChunkAssembler::Append(std::string_view bytes) {
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
  if (received_ != static_cast<int64_t>(dst_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncated data: got ", received_, " values, declared ", dst_.size()));
  }
  return absl::OkStatus();
}

}  // namespace ps
