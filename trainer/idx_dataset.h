// Reader for IDX files (the MNIST / Fashion-MNIST format), gzip-compressed or plain, and the
// examples a worker trains on: its own contiguous slice, pixels scaled to [0, 1].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/partition.h"

namespace ps {

// An IDX file's dimensions and unsigned-byte payload.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};

// Reads an IDX file of unsigned bytes with `expected_rank` dimensions. Fails with a message naming
// the file and the problem: missing, unreadable or corrupt gzip, bad magic, wrong element type or
// rank, or a payload shorter or longer than the dimensions say.
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path, int expected_rank);

// Labelled examples, row-major: features[i * num_features + j] in [0, 1].
struct Examples {
  int64_t count = 0;
  int num_features = 0;
  std::vector<float> features;
  std::vector<int32_t> labels;
};

// Loads examples [slice.begin, slice.end) of an images/labels file pair. Fails if the files
// disagree on the count, a label is outside [0, num_classes), or the slice is out of range.
absl::StatusOr<Examples> LoadIdxExamples(const std::string& images_path,
                                         const std::string& labels_path, int num_classes,
                                         const Range* slice = nullptr);

// Fashion-MNIST split "train" or "t10k" from `dir` (Debian's dataset-fashion-mnist installs
// /usr/share/datasets/fashion-mnist), optionally only a slice of it.
absl::StatusOr<Examples> LoadFashionMnist(const std::string& dir, const std::string& split,
                                          const Range* slice = nullptr);

}  // namespace ps
