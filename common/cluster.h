// The cluster as the daemons see it: the ordered list of parameter-server shard addresses. A shard
// with replication (ps --peer) is listed as its two replicas, "primary/backup" (either order:
// clients find the one serving).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ps {

// Parses "host:port,host:port/host:port,..." (shard i is the i-th entry, one address or two
// replicas joined by '/'). Fails with a message naming the bad entry on an empty list, a missing
// or non-numeric port, a port outside 1..65535, or more than two replicas.
absl::StatusOr<std::vector<std::string>> ParseShardAddresses(const std::string& list);

// The replicas of one entry of that list: "a" -> {a}, "a/b" -> {a, b}.
std::vector<std::string> ShardReplicas(const std::string& entry);

// The host and port of "host:port" or "[v6 address]:port" (brackets dropped); false without a
// colon.
bool SplitHostPort(const std::string& address, std::string* host, std::string* port);

}  // namespace ps
