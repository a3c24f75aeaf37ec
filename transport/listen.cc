#include "transport/listen.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ps {

void ListenExclusively(grpc::ServerBuilder* builder) {
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
}

std::string CannotListenReason(const std::string& host, int port) {
  std::string bare = host;
  if (bare.size() > 2 && bare.front() == '[' && bare.back() == ']') {
    bare = bare.substr(1, bare.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int e = getaddrinfo(bare.c_str(), std::to_string(port).c_str(), &hints, &found); e != 0) {
    return absl::StrCat("cannot resolve ", host, ": ", gai_strerror(e));
  }
  int error = 0;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      error = errno;
      continue;
    }
    int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);  // as gRPC does: TIME_WAIT is fine
    const bool bound = bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    error = bound ? 0 : errno;
    close(fd);
    if (!bound) break;
  }
  freeaddrinfo(found);
  if (error == EADDRINUSE) {
    return absl::StrCat("port ", port, " on ", host,
                        " is in use (another process listens there: a ps from an earlier run?)");
  }
  if (error == EADDRNOTAVAIL) return absl::StrCat(host, " is not an address of this machine");
  if (error == EACCES) return absl::StrCat("port ", port, " needs privileges (use one >= 1024)");
  if (error != 0) return absl::StrCat("cannot bind ", host, ":", port, ": ", strerror(error));
  return absl::StrCat("gRPC could not listen on ", host, ":", port);
}

}  // namespace ps
