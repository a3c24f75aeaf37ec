// The cluster as the daemons see it: the ordered list of parameter-server shard addresses.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ps {

// Parses "host:port,host:port,..." (shard i is the i-th address). Fails with a message naming the
// bad entry on an empty list, a missing or non-numeric port, or a port outside 1..65535.
absl::StatusOr<std::vector<std::string>> ParseShardAddresses(const std::string& list);

}  // namespace ps
