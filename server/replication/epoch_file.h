// The epoch file (ps --epoch_file): the highest epoch a replica took part in, kept across its
// restarts so that a replica restarted empty neither joins an older primary nor starts one by
// itself (server/replication/role_machine.h). Functions only; thread-safe as far as the file is
// not written by two at once.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ps {

// The epoch `path` holds; 0 if there is no such file. INVALID_ARGUMENT if it holds no epoch.
absl::StatusOr<int64_t> ReadEpochFile(const std::string& path);
// Writes `epoch` to `path` durably (a temporary file, fsync, rename); UNAVAILABLE naming the
// file and why if it could not be.
absl::Status WriteEpochFile(const std::string& path, int64_t epoch);

}  // namespace ps
