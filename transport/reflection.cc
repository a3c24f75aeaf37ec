#include "transport/reflection.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>

namespace ps {

void EnableServerReflection() { grpc::reflection::InitProtoReflectionServerBuilderPlugin(); }

}  // namespace ps
