// Listening on a port as its only owner. gRPC sets SO_REUSEPORT on its listening sockets by
// default, so a second server on a port already served (a stale ps from an earlier run) would
// start too and the kernel would split connections between the two: every server here turns it
// off, and a port in use makes the daemon stop, saying so.
#pragma once

#include <grpcpp/server_builder.h>

#include <string>

namespace ps {

// Makes `builder`'s listening sockets exclusive (no SO_REUSEPORT).
void ListenExclusively(grpc::ServerBuilder* builder);

// Why a server cannot listen on host:port, found by binding a socket there: "port 50198 on
// 127.0.0.1 is in use (another process listens there: a ps from an earlier run?)", "127.0.0.2 is
// not an address of this machine", or the system's error.
std::string CannotListenReason(const std::string& host, int port);

}  // namespace ps
