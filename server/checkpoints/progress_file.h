// How far a shard got, kept beside its checkpoints so that a restarted shard can say how many
// updates it lost: the version after every update is stored into a small memory-mapped file.
// A store into the page cache costs nanoseconds and outlives the process (kill -9, a crash), but
// not a crash of the host, after which the file may be older than the newest checkpoint.
// File: 8 bytes, the version as a little-endian int64. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ps {

class ProgressFile {
 public:
  // Opens (creating with version 0) and maps `path`. Fails naming the file and the system error.
  static absl::StatusOr<std::unique_ptr<ProgressFile>> Open(const std::string& path);
  ~ProgressFile();
  ProgressFile(const ProgressFile&) = delete;
  ProgressFile& operator=(const ProgressFile&) = delete;

  // The version the file held when opened: where the previous process of this shard got to.
  int64_t previous() const { return previous_; }
  // Records `version` (a shard's versions only grow; a resumed shard starts by setting its own).
  void Set(int64_t version);

 private:
  ProgressFile(int fd, int64_t* mapped, int64_t previous)
      : fd_(fd), mapped_(mapped), previous_(previous) {}

  int fd_;
  int64_t* mapped_;
  int64_t previous_;
};

}  // namespace ps
