// Appends rows to a CSV file, writing the header only when the file is new or empty, and flushing
// each row so that a process killed mid-run leaves every finished row behind. Not thread-safe.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ps {

class CsvWriter {
 public:
  // Opens `path` for appending. Fails with a message naming the path if it cannot be opened.
  static absl::StatusOr<CsvWriter> Open(const std::string& path,
                                        const std::vector<std::string>& header);
  CsvWriter(CsvWriter&& o) noexcept : file_(o.file_) { o.file_ = nullptr; }
  CsvWriter& operator=(CsvWriter&&) = delete;
  ~CsvWriter();

  // Writes one row of already-formatted fields.
  void Row(const std::vector<std::string>& fields);

 private:
  explicit CsvWriter(FILE* f) : file_(f) {}
  FILE* file_;
};

// Unix time in seconds with millisecond resolution, the time column of every CSV.
std::string WallTimeField();

}  // namespace ps
