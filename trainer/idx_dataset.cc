#include "trainer/idx_dataset.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

// Reads a whole file, inflating it if it is gzip (zlib passes plain files through).
absl::StatusOr<std::vector<uint8_t>> ReadMaybeGzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  std::unique_ptr<gzFile_s, int (*)(gzFile)> closer(f, gzclose);
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  for (;;) {
    int n = gzread(f, buf, sizeof(buf));
    if (n < 0) {
      int code = 0;
      return absl::DataLossError(absl::StrCat(path, ": corrupt file: ", gzerror(f, &code)));
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  int code = 0;
  const char* message = gzerror(f, &code);
  if (code != Z_OK) {
    return absl::DataLossError(absl::StrCat(path, ": truncated or corrupt gzip: ", message));
  }
  return out;
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path, int expected_rank) {
  absl::StatusOr<std::vector<uint8_t>> bytes = ReadMaybeGzip(path);
  if (!bytes.ok()) return bytes.status();
  const std::vector<uint8_t>& b = *bytes;
  if (b.size() < 4 || b[0] != 0 || b[1] != 0) {
    return absl::DataLossError(absl::StrCat(path, ": not an IDX file (bad magic number)"));
  }
  if (b[2] != 0x08) {
    return absl::DataLossError(
        absl::StrCat(path, ": IDX element type 0x", absl::Hex(b[2]), ", expected 0x08 (ubyte)"));
  }
  if (b[3] != expected_rank) {
    return absl::DataLossError(
        absl::StrCat(path, ": IDX rank ", b[3], ", expected ", expected_rank));
  }
  size_t header = 4 + 4 * static_cast<size_t>(expected_rank);
  if (b.size() < header) return absl::DataLossError(absl::StrCat(path, ": truncated IDX header"));
  IdxArray out;
  int64_t elements = 1;
  for (int d = 0; d < expected_rank; ++d) {
    const uint8_t* p = &b[4 + 4 * d];
    int64_t dim = (int64_t{p[0]} << 24) | (p[1] << 16) | (p[2] << 8) | p[3];
    if (dim <= 0) return absl::DataLossError(absl::StrCat(path, ": dimension ", d, " is zero"));
    out.dims.push_back(dim);
    elements *= dim;
  }
  if (static_cast<int64_t>(b.size() - header) != elements) {
    return absl::DataLossError(
        absl::StrCat(path, ": payload has ", b.size() - header, " bytes, header says ", elements,
                     b.size() - header < static_cast<size_t>(elements) ? " (truncated file)"
                                                                       : " (trailing garbage)"));
  }
  out.data.assign(b.begin() + header, b.end());
  return out;
}

absl::StatusOr<Examples> LoadIdxExamples(const std::string& images_path,
                                         const std::string& labels_path, int num_classes,
                                         const Range* slice) {
  absl::StatusOr<IdxArray> images = ReadIdxFile(images_path, 3);
  if (!images.ok()) return images.status();
  absl::StatusOr<IdxArray> labels = ReadIdxFile(labels_path, 1);
  if (!labels.ok()) return labels.status();
  int64_t n = images->dims[0];
  if (labels->dims[0] != n) {
    return absl::DataLossError(absl::StrCat(images_path, " has ", n, " images but ", labels_path,
                                            " has ", labels->dims[0], " labels"));
  }
  Range r = slice != nullptr ? *slice : Range{0, n};
  if (!Range{0, n}.Contains(r.begin, r.end)) {
    return absl::OutOfRangeError(
        absl::StrCat("slice [", r.begin, ", ", r.end, ") is outside the ", n, " examples"));
  }
  Examples ex;
  ex.count = r.size();
  ex.num_features = static_cast<int>(images->dims[1] * images->dims[2]);
  ex.features.resize(ex.count * ex.num_features);
  ex.labels.resize(ex.count);
  const uint8_t* pixels = images->data.data() + r.begin * ex.num_features;
  for (size_t i = 0; i < ex.features.size(); ++i) ex.features[i] = pixels[i] / 255.0f;
  for (int64_t i = 0; i < ex.count; ++i) {
    int label = labels->data[r.begin + i];
    if (label >= num_classes) {
      return absl::DataLossError(absl::StrCat(labels_path, ": label ", label, " at index ",
                                              r.begin + i, " is not below ", num_classes));
    }
    ex.labels[i] = label;
  }
  return ex;
}

absl::StatusOr<Examples> LoadFashionMnist(const std::string& dir, const std::string& split,
                                          const Range* slice) {
  if (split != "train" && split != "t10k") {
    return absl::InvalidArgumentError("Fashion-MNIST split must be 'train' or 't10k'");
  }
  std::string base = dir + "/" + split;
  return LoadIdxExamples(base + "-images-idx3-ubyte.gz", base + "-labels-idx1-ubyte.gz",
                         /*num_classes=*/10, slice);
}

}  // namespace ps
