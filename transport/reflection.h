// gRPC server reflection (grpc.reflection.v1alpha) on every gRPC server the process starts from
// now on, so that tools such as grpcurl or grpc_cli can list and call a daemon's services without
// the .proto files. It describes the API only; every call still needs what it always needed.
// Linked into the daemons alone (ps_reflection): a process must not hold two compiled copies of
// reflection.proto, and the tests carry their own to call it.
#pragma once

namespace ps {

// Idempotent; call before building servers.
void EnableServerReflection();

}  // namespace ps
