// Every shard's statistics (GetStats), read through a ShardedClient with its retries, token and
// replicas: for tools, tests and benchmarks that want the wire's StatsResponse (the client itself
// keeps protobuf out of its interface).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "proto/ps.pb.h"
#include "worker/sharded_client.h"

namespace ps {

// By shard, with every worker (GetStats answers a page of at most 256: the pages are fetched one
// after another and joined). Fails like any call of the client, or with DATA_LOSS for an answer
// that does not parse.
absl::StatusOr<std::vector<v1::StatsResponse>> FetchStats(ShardedClient& client);

}  // namespace ps
