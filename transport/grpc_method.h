// A gRPC method of a generated service, found by name in the descriptors protoc compiled in: its
// index in the service (what grpc::Service's MarkMethod* calls take) and the path clients call it
// by ("/ps.v1.ParameterServer/Push"). Code that replaces a generated handler or calls a method on
// raw bytes names the method, so reordering the methods of a .proto cannot send it elsewhere.
// Thread-safe.
#pragma once

#include <google/protobuf/descriptor.h>

#include "absl/strings/string_view.h"

namespace ps {

// Method `method` of the service named `service` ("ps.v1.ParameterServer"). A name the
// descriptors do not hold is a programming error (a method renamed in the .proto but not here):
// logs both names and aborts, which the first test that builds the service or client catches.
const google::protobuf::MethodDescriptor& FindGrpcMethod(absl::string_view service,
                                                         absl::string_view method);

// The path gRPC calls `method` of the service named `service` by. The string lives as long as the
// process (grpc::internal::RpcMethod keeps the pointer it is given).
const char* GrpcMethodPath(absl::string_view service, absl::string_view method);

// The same for a generated service class (v1::ParameterServer, v1::Replication).
template <typename GrpcService>
int MethodIndex(absl::string_view method) {
  return FindGrpcMethod(GrpcService::service_full_name(), method).index();
}
template <typename GrpcService>
const char* MethodPath(absl::string_view method) {
  return GrpcMethodPath(GrpcService::service_full_name(), method);
}

}  // namespace ps
