#include "server/checkpoints/progress_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

absl::Status Error(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProgressFile>> ProgressFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Error("open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0 || (st.st_size != sizeof(int64_t) && ::ftruncate(fd, 0) != 0) ||
      ::ftruncate(fd, sizeof(int64_t)) != 0) {
    absl::Status s = Error("size", path);
    ::close(fd);
    return s;
  }
  void* mapped = ::mmap(nullptr, sizeof(int64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mapped == MAP_FAILED) {
    absl::Status s = Error("map", path);
    ::close(fd);
    return s;
  }
  auto* value = static_cast<int64_t*>(mapped);
  int64_t previous = __atomic_load_n(value, __ATOMIC_RELAXED);  // a file of another size reads 0
  return std::unique_ptr<ProgressFile>(new ProgressFile(fd, value, previous));
}

ProgressFile::~ProgressFile() {
  ::munmap(mapped_, sizeof(int64_t));
  ::close(fd_);
}

void ProgressFile::Set(int64_t version) { __atomic_store_n(mapped_, version, __ATOMIC_RELAXED); }

}  // namespace ps
