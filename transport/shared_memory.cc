#include "transport/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace ps {
namespace {

// Layout: a header page (the nonce, then each region's state word on its own cache line), then the
// push region and the pull region, each rounded up to whole pages.
constexpr int64_t kPage = 4096;
constexpr int64_t kPushStateOffset = 64, kPullStateOffset = 128;
constexpr char kMemfdName[] = "ps-shard-data";
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "state words shared between processes must be lock-free");

int64_t RoundUp(int64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }
int64_t MappedBytes(int64_t region_bytes) { return kPage + 2 * RoundUp(region_bytes); }

std::string Errno(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

uint64_t Word(SharedRegion::Phase phase, uint64_t ticket) { return ticket << 2 | phase; }

}  // namespace

const std::string& ProcessSpaceId() {
  static const std::string* id = [] {
    std::string boot;
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::getline(in, boot);
    char ns[64];
    ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof(ns));
    if (boot.empty() || n <= 0) return new std::string();
    return new std::string(absl::StrCat(boot, " ", absl::string_view(ns, n)));
  }();
  return *id;
}

bool SharedRegion::Claim(Phase phase, uint64_t ticket, absl::Time deadline) {
  absl::Duration pause = absl::Microseconds(1);
  for (;;) {
    uint64_t s = state_->load(std::memory_order_acquire);
    if ((s & 3) != kBusy) {
      if (state_->compare_exchange_strong(s, Word(phase, ticket), std::memory_order_acq_rel)) {
        return true;
      }
      continue;
    }
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(1));
  }
}

bool SharedRegion::Move(Phase from, Phase to, uint64_t ticket) {
  uint64_t expected = Word(from, ticket);
  return state_->compare_exchange_strong(expected, Word(to, ticket), std::memory_order_acq_rel);
}

bool SharedRegion::DiscardIfIdle() {
  uint64_t idle = state_->load(std::memory_order_acquire);
  if ((idle & 3) != kIdle) return false;
  const uint64_t ticket = idle >> 2;
  if (!state_->compare_exchange_strong(idle, Word(kBusy, ticket), std::memory_order_acq_rel)) {
    return false;
  }
  if (capacity_ > 0) madvise(data_, RoundUp(capacity_), MADV_REMOVE);
  Move(kBusy, kIdle, ticket);
  return true;
}

absl::StatusOr<SharedSegment> SharedSegment::Create(int64_t region_bytes) {
  if (region_bytes < 0) return absl::InvalidArgumentError("negative region size");
  const int64_t mapped = MappedBytes(region_bytes);
  int fd = memfd_create(kMemfdName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return absl::InternalError(Errno("memfd_create"));
  if (ftruncate(fd, mapped) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    std::string why = Errno("sizing and sealing the segment");
    close(fd);
    return absl::InternalError(why);
  }
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    std::string why = Errno("mmap");
    close(fd);
    return absl::ResourceExhaustedError(why);
  }
  std::string nonce(kNonceBytes, '\0');
  if (getrandom(nonce.data(), nonce.size(), 0) != static_cast<ssize_t>(nonce.size())) {
    std::string why = Errno("getrandom");
    munmap(base, mapped);
    close(fd);
    return absl::InternalError(why);
  }
  std::memcpy(base, nonce.data(), nonce.size());
  return SharedSegment(fd, static_cast<char*>(base), mapped, region_bytes, std::move(nonce));
}

absl::StatusOr<SharedSegment> SharedSegment::Open(int pid, int fd, const std::string& nonce,
                                                  int64_t region_bytes) {
  if (pid <= 0 || fd < 0 || region_bytes < 0 || nonce.size() != kNonceBytes) {
    return absl::InvalidArgumentError("not a shared memory segment's description");
  }
  const std::string path = absl::StrCat("/proc/", pid, "/fd/", fd);
  // Only a shard's memfd is opened (a stale pid or descriptor could name anything), without
  // waiting (a FIFO would) or taking a terminal.
  char target[64];
  const ssize_t n = readlink(path.c_str(), target, sizeof(target));
  if (n < 0) return absl::UnavailableError(Errno(path.c_str()));
  if (!absl::StartsWith(absl::string_view(target, n), absl::StrCat("/memfd:", kMemfdName))) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a shard's segment"));
  }
  int own = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (own < 0) return absl::UnavailableError(Errno(path.c_str()));
  const int64_t mapped = MappedBytes(region_bytes);
  struct stat st;
  const int seals = fcntl(own, F_GET_SEALS);
  if (fstat(own, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != mapped || seals < 0 ||
      (seals & F_SEAL_SHRINK) == 0) {
    close(own);
    return absl::FailedPreconditionError(
        absl::StrFormat("%s is not a sealed segment of %d bytes", path, mapped));
  }
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, own, 0);
  if (base == MAP_FAILED) {
    std::string why = Errno("mmap");
    close(own);
    return absl::ResourceExhaustedError(why);
  }
  SharedSegment segment(own, static_cast<char*>(base), mapped, region_bytes, nonce);
  if (std::memcmp(base, nonce.data(), nonce.size()) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is another segment than the shard described (another host?)"));
  }
  return segment;
}

SharedSegment::SharedSegment(SharedSegment&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)),
      base_(std::exchange(o.base_, nullptr)),
      mapped_(o.mapped_),
      region_bytes_(o.region_bytes_),
      nonce_(std::move(o.nonce_)) {}

SharedSegment::~SharedSegment() {
  if (base_ != nullptr) munmap(base_, mapped_);
  if (fd_ >= 0) close(fd_);
}

SharedRegion SharedSegment::push() const {
  return SharedRegion(reinterpret_cast<std::atomic<uint64_t>*>(base_ + kPushStateOffset),
                      base_ + kPage, region_bytes_);
}

SharedRegion SharedSegment::pull() const {
  return SharedRegion(reinterpret_cast<std::atomic<uint64_t>*>(base_ + kPullStateOffset),
                      base_ + kPage + RoundUp(region_bytes_), region_bytes_);
}

}  // namespace ps
