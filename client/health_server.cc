#include "client/health_server.h"

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "transport/listen.h"

namespace ps {

absl::StatusOr<std::unique_ptr<grpc::Server>> StartHealthServer(const std::string& host, int port,
                                                                int* bound_port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  std::string address = absl::StrCat(host, ":", port);
  ListenExclusively(&builder);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), bound_port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve health on ", address, ": ",
                                               CannotListenReason(host, port)));
  }
  return server;
}

}  // namespace ps
