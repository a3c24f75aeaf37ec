// How a client of the shards (ShardedClient: workers, the evaluator, psctl, export_model) sets up
// its gRPC channels: reconnect soon after a shard comes back (gRPC's default waits 1 s, then ever
// longer, up to 120 s, and meanwhile fails calls with the cached "connection refused"), and notice
// a peer that stopped answering (SIGSTOP, a hung host) within seconds rather than at the call's
// deadline. (A backup's channel to its primary keeps its own, slower keepalive: server/replication/replica.cc.)
// Risk noted, not seen: on a very slow link a ping queued behind megabytes of a push could miss
// the 2 s; the call then fails UNAVAILABLE and is retried.
#pragma once

#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

namespace ps {

// A call whose peer has not answered a keepalive ping fails UNAVAILABLE at most
// kKeepaliveTimeMs + kKeepaliveTimeoutMs after the last bytes it received from it.
inline constexpr int kKeepaliveTimeMs = 1000;
inline constexpr int kKeepaliveTimeoutMs = 2000;
// Reconnection attempts start 100 ms after a failure and are at most this far apart.
inline constexpr int kMaxReconnectBackoffMs = 500;

// Channel arguments for a client of a shard: the keepalive and reconnection above.
grpc::ChannelArguments ShardChannelArguments();

// What a shard's server must allow for its clients' keepalive pings (pings every
// kKeepaliveTimeMs while a call waits, e.g. a pull held at a barrier, are not "too many").
void AllowClientKeepalive(grpc::ServerBuilder* builder);

}  // namespace ps
