#include "common/csv_writer.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace ps {

absl::StatusOr<CsvWriter> CsvWriter::Open(const std::string& path,
                                          const std::vector<std::string>& header) {
  FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  if (std::ftell(f) == 0) std::fprintf(f, "%s\n", absl::StrJoin(header, ",").c_str());
  std::fflush(f);
  return CsvWriter(f);
}

CsvWriter::~CsvWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void CsvWriter::Row(const std::vector<std::string>& fields) {
  std::fprintf(file_, "%s\n", absl::StrJoin(fields, ",").c_str());
  std::fflush(file_);
}

std::string WallTimeField() {
  return absl::StrFormat("%.3f", absl::ToUnixMillis(absl::Now()) / 1e3);
}

}  // namespace ps
