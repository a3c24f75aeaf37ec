#include "transport/grpc_method.h"

#include <cstdlib>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"

namespace ps {

const google::protobuf::MethodDescriptor& FindGrpcMethod(absl::string_view service,
                                                         absl::string_view method) {
  const google::protobuf::ServiceDescriptor* s =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(std::string(service));
  const google::protobuf::MethodDescriptor* m =
      s == nullptr ? nullptr : s->FindMethodByName(std::string(method));
  if (m == nullptr) {
    PS_LOG(ERROR) << "no gRPC method " << method << " in service " << service
                  << " (compiled from the .proto files): the code names a method they lack";
    std::abort();
  }
  return *m;
}

const char* GrpcMethodPath(absl::string_view service, absl::string_view method) {
  static absl::Mutex mu(absl::kConstInit);
  // Never freed, and node-based: a path's characters never move.
  static std::set<std::string>* paths ABSL_GUARDED_BY(mu) = new std::set<std::string>;
  const google::protobuf::MethodDescriptor& m = FindGrpcMethod(service, method);
  std::string path = absl::StrCat("/", m.service()->full_name(), "/", m.name());
  absl::MutexLock lock(&mu);
  return paths->insert(std::move(path)).first->c_str();
}

}  // namespace ps
