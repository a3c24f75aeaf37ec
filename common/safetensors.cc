#include "common/safetensors.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/log.h"

namespace ps {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors are little-endian");

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat("cannot ", what, " ", path, ": ", strerror(errno)));
}

uint32_t Crc32(uint32_t crc, const void* data, size_t bytes) {
  const auto* p = static_cast<const Bytef*>(data);
  while (bytes > 0) {  // zlib takes uInt lengths
    uInt n = static_cast<uInt>(std::min<size_t>(bytes, 1u << 30));
    crc = crc32(crc, p, n);
    p += n;
    bytes -= n;
  }
  return crc;
}

absl::Status WriteAll(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Errno("write", path);
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

std::string Directory(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

absl::Status DataLoss(const std::string& path, const std::string& why) {
  return absl::DataLossError(absl::StrCat(path, ": ", why));
}

constexpr char kChecksumKey[] = "file_crc32";
constexpr size_t kChecksumDigits = 8;
constexpr char kChecksumBlank[] = "00000000";

// Where the value of `"file_crc32":"<value>"` starts in a header's JSON text, as the writer lays
// it out (no spaces, no escapes); npos unless it occurs exactly once. A '"' that is not escaped
// always delimits a string, so this text can only be the key and its value, not part of a string.
size_t ChecksumValueAt(absl::string_view text, absl::string_view value) {
  const std::string needle = absl::StrCat("\"", kChecksumKey, "\":\"", value, "\"");
  size_t at = text.find(needle);
  if (at == absl::string_view::npos || text.find(needle, at + 1) != absl::string_view::npos) {
    return std::string::npos;
  }
  return at + needle.size() - 1 - value.size();
}

// OK if the metadata's file_crc32 is the CRC-32 of `bytes` (the whole file) with that value's
// 8 digits read as '0's (`data_start`: where the header ends); DATA_LOSS naming the file and the
// checksum otherwise.
absl::Status CheckWholeFile(const std::string& path, const std::string& bytes, size_t data_start,
                            const nlohmann::json& header, bool* legacy) {
  *legacy = false;
  const nlohmann::json* metadata =
      header.contains("__metadata__") ? &header["__metadata__"] : nullptr;
  if (metadata == nullptr || !metadata->is_object() || !metadata->contains(kChecksumKey)) {
    if (metadata != nullptr && metadata->is_object() && metadata->contains("crc32")) {
      *legacy = true;  // the older format: its tensors' crc32 is checked by the caller
      return absl::OkStatus();
    }
    return DataLoss(path, "no checksum (metadata file_crc32): not written by this program");
  }
  const nlohmann::json& value = (*metadata)[kChecksumKey];
  uint32_t expected = 0;
  if (!value.is_string() || value.get<std::string>().size() != kChecksumDigits ||
      value.get<std::string>().find_first_not_of("0123456789abcdef") != std::string::npos ||
      !absl::SimpleHexAtoi(value.get<std::string>(), &expected)) {
    return DataLoss(path, "checksum mismatch: file_crc32 is not 8 hex digits");
  }
  // Searched in the header only: the data could hold the same bytes.
  const size_t at =
      ChecksumValueAt(absl::string_view(bytes).substr(0, data_start), value.get<std::string>());
  if (at == std::string::npos) {
    return DataLoss(path, "checksum mismatch: the header does not hold file_crc32 as written");
  }
  uint32_t crc = Crc32(crc32(0, nullptr, 0), bytes.data(), at);
  crc = Crc32(crc, kChecksumBlank, kChecksumDigits);
  crc = Crc32(crc, bytes.data() + at + kChecksumDigits, bytes.size() - at - kChecksumDigits);
  if (crc != expected) {
    return DataLoss(path,
                    "checksum mismatch: the file is torn or was changed after it was written "
                    "(its header or its tensors)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                              std::map<std::string, std::string> metadata) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const TensorView& t : tensors) {
    if (t.name == "__metadata__" || header.contains(t.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot write ", path, ": tensor name \"", t.name, "\" is ",
                       t.name == "__metadata__" ? "safetensors' own key" : "given twice"));
    }
    uint64_t bytes = t.data.size() * sizeof(float);
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  metadata[kChecksumKey] = kChecksumBlank;
  header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  uint64_t length = text.size();
  // The checksum covers every byte of the file, its own value blanked.
  const size_t at = ChecksumValueAt(text, kChecksumBlank);
  if (at == std::string::npos) return absl::InternalError("checksum placeholder not found");
  uint32_t crc = Crc32(crc32(0, nullptr, 0), &length, sizeof(length));
  crc = Crc32(crc, text.data(), text.size());
  for (const TensorView& t : tensors) {
    crc = Crc32(crc, t.data.data(), t.data.size() * sizeof(float));
  }
  text.replace(at, kChecksumDigits, absl::StrFormat("%08x", crc));

  std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create", tmp);
  absl::Status s = WriteAll(fd, &length, sizeof(length), tmp);
  if (s.ok()) s = WriteAll(fd, text.data(), text.size(), tmp);
  for (size_t i = 0; s.ok() && i < tensors.size(); ++i) {
    s = WriteAll(fd, tensors[i].data.data(), tensors[i].data.size() * sizeof(float), tmp);
  }
  if (s.ok() && fsync(fd) != 0) s = Errno("fsync", tmp);
  if (close(fd) != 0 && s.ok()) s = Errno("close", tmp);
  if (s.ok() && rename(tmp.c_str(), path.c_str()) != 0) s = Errno("rename to", path);
  if (!s.ok()) {
    unlink(tmp.c_str());
    return s;
  }
  // The rename is durable only once the directory is.
  std::string dir = Directory(path);
  int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return Errno("open directory", dir);
  s = fsync(dir_fd) == 0 ? absl::OkStatus() : Errno("fsync directory", dir);
  close(dir_fd);
  return s;
}

absl::StatusOr<Safetensors> ReadSafetensors(const std::string& path) {
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(path, error);  // fails on a directory too
  std::ifstream in(path, std::ios::binary);
  if (error || !in) {
    return absl::NotFoundError(
        absl::StrCat("cannot open ", path, error ? ": " + error.message() : ""));
  }
  // One read of the whole file (an istreambuf_iterator copies it a character at a time).
  std::string bytes(size, '\0');
  if (!in.read(bytes.data(), static_cast<std::streamsize>(size))) {
    return DataLoss(path, "could not be read to its end");
  }
  uint64_t length = 0;
  if (bytes.size() < sizeof(length)) return DataLoss(path, "shorter than its 8-byte header length");
  std::memcpy(&length, bytes.data(), sizeof(length));
  if (length > bytes.size() - sizeof(length)) {
    return DataLoss(path, absl::StrCat("header of ", length, " bytes runs past the end"));
  }
  nlohmann::json header = nlohmann::json::parse(
      bytes.begin() + sizeof(length), bytes.begin() + static_cast<int64_t>(sizeof(length) + length),
      /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) return DataLoss(path, "the header is not a JSON object");
  const uint64_t data_start = sizeof(length) + length, data_size = bytes.size() - data_start;
  bool legacy = false;
  if (absl::Status s = CheckWholeFile(path, bytes, data_start, header, &legacy); !s.ok()) return s;
  Safetensors out;
  std::map<uint64_t, std::string> by_offset;  // legacy: the tensors in file order, for crc32
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return DataLoss(path, "__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) return DataLoss(path, "metadata value " + key + " is not a string");
        out.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    const nlohmann::json* offsets =
        entry.is_object() && entry.contains("data_offsets") ? &entry["data_offsets"] : nullptr;
    if (offsets == nullptr || !entry.contains("dtype") || entry["dtype"] != "F32" ||
        !entry.contains("shape") || !entry["shape"].is_array() || !offsets->is_array() ||
        offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
        !(*offsets)[1].is_number_unsigned()) {
      return DataLoss(path, "tensor " + name + " is not an F32 tensor with shape and offsets");
    }
    uint64_t begin = (*offsets)[0], end = (*offsets)[1];
    Safetensors::Tensor t;
    uint64_t count = 1;
    for (const nlohmann::json& d : entry["shape"]) {
      if (!d.is_number_unsigned()) return DataLoss(path, "tensor " + name + " has a bad shape");
      t.shape.push_back(d.get<int64_t>());
      count *= d.get<uint64_t>();
    }
    if (begin > end || end > data_size || end - begin != count * sizeof(float)) {
      return DataLoss(path, absl::StrCat("tensor ", name, " [", begin, ", ", end,
                                         ") does not fit its shape or the file"));
    }
    t.data.resize(count);
    if (count > 0) std::memcpy(t.data.data(), bytes.data() + data_start + begin, end - begin);
    by_offset[begin] = name;
    out.tensors[name] = std::move(t);
  }
  if (legacy) {
    uint32_t crc = crc32(0, nullptr, 0), expected = 0;
    for (const auto& [offset, name] : by_offset) {
      const std::vector<float>& d = out.tensors[name].data;
      crc = Crc32(crc, d.data(), d.size() * sizeof(float));
    }
    if (!absl::SimpleAtoi(out.metadata["crc32"], &expected) || expected != crc) {
      return DataLoss(path, "checksum mismatch: the tensors are corrupt or the file is torn");
    }
    PS_LOG(WARNING) << path << ": written by an older version, whose crc32 covers the tensors "
                    << "only: its header (versions, workers' sequences) is unverified. Files "
                    << "written from now on carry file_crc32, over the whole file";
  }
  return out;
}

}  // namespace ps
