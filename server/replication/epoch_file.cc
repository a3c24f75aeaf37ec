#include "server/replication/epoch_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace ps {

absl::StatusOr<int64_t> ReadEpochFile(const std::string& path) {
  std::ifstream in(path);
  int64_t epoch = 0;
  if (in && !(in >> epoch)) return absl::InvalidArgumentError(path + " holds no epoch");
  return epoch;
}

absl::Status WriteEpochFile(const std::string& path, int64_t epoch) {
  const std::string tmp = path + ".tmp";
  const std::string text = absl::StrCat(epoch, "\n");
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
            fsync(fd) == 0;
  if (fd >= 0) ok = close(fd) == 0 && ok;
  ok = ok && std::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) {
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace ps
