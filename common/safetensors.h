// safetensors files (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
// length, a JSON header naming each tensor's dtype, shape and byte range, then the raw
// little-endian tensors. NumPy (safetensors.numpy) and PyTorch read them. This project writes
// float32 tensors only, plus string metadata in "__metadata__", including "file_crc32": zlib's
// CRC-32 of the whole file (length, header, padding, tensors) as 8 lowercase hex digits, computed
// with those 8 digits written as "00000000". A file torn or changed anywhere, its metadata
// included, is refused. The value is found in the header text as the writer lays it out
// (`"file_crc32":"xxxxxxxx"`, exactly once), so the check needs no canonical re-serialisation.
// Files of older versions (metadata "crc32", over the tensor bytes only) still read, their tensors
// checked and a warning logged that their metadata is unverified: an upgraded shard resumes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ps {

struct TensorView {
  std::string name;
  std::vector<int64_t> shape;
  absl::Span<const float> data;  // product(shape) values
};

// Writes `tensors` and `metadata` to `path` atomically: a temporary file beside it, fsync,
// rename, fsync of the directory. A reader sees the old file or the whole new one, even after a
// crash. Fails naming the file and the system error, or (INVALID_ARGUMENT) a tensor name given
// twice or "__metadata__".
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                              std::map<std::string, std::string> metadata);

struct Safetensors {
  std::map<std::string, std::string> metadata;
  struct Tensor {
    std::vector<int64_t> shape;
    std::vector<float> data;
  };
  std::map<std::string, Tensor> tensors;
};

// Reads a file written by WriteSafetensors. Fails with DATA_LOSS naming the file and the problem
// (truncated, a header that does not parse or points outside the file, a dtype other than F32, a
// checksum mismatch: "checksum" is in the message, no or an older checksum) and with NOT_FOUND if
// there is no such regular file or it cannot be opened.
absl::StatusOr<Safetensors> ReadSafetensors(const std::string& path);

}  // namespace ps
