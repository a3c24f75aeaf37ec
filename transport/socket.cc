#include "transport/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "transport/tls.h"

namespace ps {
namespace {

std::string Errno(int e) { return std::strerror(e); }

absl::Status SetUp(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return absl::InternalError(absl::StrCat("fcntl: ", Errno(errno)));
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return absl::OkStatus();
}

// The addresses of host:port, for a listener (`passive`) or a connection.
absl::StatusOr<std::unique_ptr<addrinfo, void (*)(addrinfo*)>> Resolve(const std::string& host,
                                                                       int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int e = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
      e != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(e)));
  }
  return std::unique_ptr<addrinfo, void (*)(addrinfo*)>(found, freeaddrinfo);
}

int Millis(absl::Duration d) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 0, 1 << 30)) + 1;
}

// Small pieces of a Send are gathered into one TLS record (a frame's header with its payload).
constexpr size_t kGatherBytes = 4096;

}  // namespace

struct Socket::Tls {
  explicit Tls(SSL* s) : ssl(s) {}
  ~Tls() { SSL_free(ssl); }
  SSL* const ssl;
  std::mutex mu;  // one TLS call at a time (OpenSSL's rule for one connection)
};

Socket::Socket() = default;

Socket::Socket(int fd, absl::Duration stall) : fd_(fd), stall_(stall) {}

Socket::Socket(Socket&& o) noexcept
    : tls_(std::move(o.tls_)),
      fd_(std::exchange(o.fd_, -1)),
      stall_(o.stall_),
      shut_down_(std::move(o.shut_down_)) {
  o.shut_down_ = std::make_unique<std::atomic<bool>>(false);
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    tls_ = std::move(o.tls_);
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    stall_ = o.stall_;
    std::swap(shut_down_, o.shut_down_);
  }
  return *this;
}

Socket::~Socket() {
  tls_.reset();
  if (fd_ >= 0) close(fd_);
}

namespace {

// OpenSSL's socket BIO writes with write(2), which raises SIGPIPE once the peer has gone (and ends
// the process): a BIO that writes with send(MSG_NOSIGNAL) instead, as the plaintext path does. It
// only writes; the reading BIO stays OpenSSL's own.
int SendNoSignal(BIO* b, const char* data, size_t size, size_t* written) {
  BIO_clear_retry_flags(b);
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(b)));
  const ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
  if (n >= 0) {
    *written = static_cast<size_t>(n);
    return 1;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) BIO_set_retry_write(b);
  return 0;
}

long WriterControl(BIO*, int command, long, void*) { return command == BIO_CTRL_FLUSH ? 1 : 0; }

BIO* NoSignalWriter(int fd) {
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR,
                                 "socket without SIGPIPE");
    BIO_meth_set_write_ex(m, SendNoSignal);
    BIO_meth_set_ctrl(m, WriterControl);
    return m;
  }();
  BIO* b = BIO_new(method);
  if (b != nullptr) {
    BIO_set_data(b, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
    BIO_set_init(b, 1);
  }
  return b;
}

}  // namespace

absl::Status Socket::Secure(const TlsContext& tls, const std::string& peer_host,
                            absl::Time deadline) {
  const bool client = tls.side() == TlsContext::Side::kClient;
  if (client && peer_host.empty()) {
    return absl::InvalidArgumentError("TLS: no host to check the peer's certificate against");
  }
  SSL* ssl = SSL_new(tls.get());
  if (ssl == nullptr) return absl::UnavailableError("TLS: " + TlsErrorReason("no connection"));
  tls_ = std::make_unique<Tls>(ssl);
  BIO* in = BIO_new_socket(fd_, BIO_NOCLOSE);
  BIO* out = NoSignalWriter(fd_);
  if (in == nullptr || out == nullptr) {
    BIO_free(in);
    BIO_free(out);
    return absl::UnavailableError("TLS: " + TlsErrorReason("no BIO"));
  }
  SSL_set_bio(ssl, in, out);  // the connection owns them now
  SSL_set_mode(ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (client) {
    X509_VERIFY_PARAM* check = SSL_get0_param(ssl);
    X509_VERIFY_PARAM_set_hostflags(check, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    // An address is checked against the certificate's IP names, anything else its DNS names.
    if (X509_VERIFY_PARAM_set1_ip_asc(check, peer_host.c_str()) != 1) {
      ERR_clear_error();
      if (X509_VERIFY_PARAM_set1_host(check, peer_host.c_str(), peer_host.size()) != 1) {
        return absl::UnavailableError("TLS: cannot check the peer's certificate for " + peer_host);
      }
      SSL_set_tlsext_host_name(ssl, peer_host.c_str());
    }
    SSL_set_connect_state(ssl);
  } else {
    SSL_set_accept_state(ssl);
  }
  for (;;) {
    const TlsResult r = TlsCall([&] { return SSL_do_handshake(ssl); });
    if (r.error == SSL_ERROR_NONE) return absl::OkStatus();
    if (r.error == SSL_ERROR_SSL && SSL_get_verify_result(ssl) != X509_V_OK) {
      return absl::UnavailableError(
          absl::StrCat("TLS handshake: the peer's certificate: ",
                       X509_verify_cert_error_string(SSL_get_verify_result(ssl))));
    }
    if (absl::Status s = AwaitTls(r, deadline, stall_, "TLS handshake"); !s.ok()) return s;
  }
}

template <typename Call>
Socket::TlsResult Socket::TlsCall(Call call) {
  std::lock_guard<std::mutex> lock(tls_->mu);
  ERR_clear_error();
  errno = 0;
  const int result = call();
  const int error = result > 0 ? SSL_ERROR_NONE : SSL_get_error(tls_->ssl, result);
  return {error, errno};
}

absl::Status Socket::AwaitTls(TlsResult r, absl::Time deadline, absl::Duration stall,
                              const char* what) {
  if (r.error == SSL_ERROR_WANT_READ) return Await(POLLIN, deadline, stall, what);
  if (r.error == SSL_ERROR_WANT_WRITE) return Await(POLLOUT, deadline, stall, what);
  if (shut_down_->load()) return absl::UnavailableError("the connection was shut down");
  if (r.error == SSL_ERROR_ZERO_RETURN || (r.error == SSL_ERROR_SYSCALL && r.sys_error == 0)) {
    return absl::UnavailableError(absl::StrCat(what, ": the peer closed the connection"));
  }
  if (r.error == SSL_ERROR_SYSCALL) {
    return absl::UnavailableError(absl::StrCat(what, ": ", Errno(r.sys_error)));
  }
  return absl::UnavailableError(
      absl::StrCat(what, ": ", TlsErrorReason("TLS error (does the peer use TLS?)")));
}

absl::StatusOr<Socket> Socket::Connect(const std::string& host, int port, absl::Time deadline,
                                       absl::Duration stall) {
  auto addresses = Resolve(host, port, /*passive=*/false);
  if (!addresses.ok()) return addresses.status();
  std::string why = "no address";
  for (addrinfo* a = addresses->get(); a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = Errno(errno);
      continue;
    }
    Socket s(fd, stall);
    if (absl::Status set = SetUp(fd); !set.ok()) return set;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      why = Errno(errno);
      continue;
    }
    if (absl::Status ready = s.Await(POLLOUT, deadline, stall, "connecting"); !ready.ok()) {
      why = std::string(ready.message());
      continue;
    }
    int error = 0;
    socklen_t len = sizeof(error);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
    if (error != 0) {
      why = Errno(error);
      continue;
    }
    return s;
  }
  return absl::UnavailableError(absl::StrCat("cannot connect to ", host, ":", port, ": ", why));
}

absl::Status Socket::AwaitReadable(absl::Time deadline) {
  if (tls_ != nullptr) return AwaitReadableTls(deadline);
  return Await(POLLIN, deadline, absl::InfiniteDuration(), "waiting for a message");
}

absl::Status Socket::Await(short events, absl::Time deadline, absl::Duration stall,
                           const char* what) {
  const absl::Time stalled = absl::Now() + stall;
  for (;;) {
    if (shut_down_->load()) return absl::UnavailableError("the connection was shut down");
    const absl::Time now = absl::Now();
    const absl::Time end = std::min(deadline, stalled);
    if (now >= end) {
      return absl::DeadlineExceededError(
          end == stalled
              ? absl::StrCat(what, ": the peer made no progress for ", absl::FormatDuration(stall))
              : absl::StrCat(what, ": its deadline passed"));
    }
    pollfd p{fd_, events, 0};
    int n = poll(&p, 1, Millis(end - now));
    if (n < 0 && errno != EINTR)
      return absl::UnavailableError(absl::StrCat("poll: ", Errno(errno)));
    if (n > 0) return absl::OkStatus();  // ready, or an error the next call reports
  }
}

absl::Status Socket::Send(absl::Span<const iovec> pieces, absl::Time deadline) {
  if (tls_ != nullptr) return SendTls(pieces, deadline);
  std::vector<iovec> left(pieces.begin(), pieces.end());
  size_t first = 0;
  while (first < left.size()) {
    msghdr m{};
    m.msg_iov = left.data() + first;
    m.msg_iovlen = std::min<size_t>(left.size() - first, IOV_MAX);
    ssize_t n = sendmsg(fd_, &m, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return absl::UnavailableError(absl::StrCat("sending: ", Errno(errno)));
      }
      if (absl::Status s = Await(POLLOUT, deadline, stall_, "sending"); !s.ok()) return s;
      continue;
    }
    for (size_t done = static_cast<size_t>(n); first < left.size() && done > 0;) {
      size_t step = std::min(done, left[first].iov_len);
      left[first].iov_base = static_cast<char*>(left[first].iov_base) + step;
      left[first].iov_len -= step;
      done -= step;
      if (left[first].iov_len == 0) ++first;
    }
    while (first < left.size() && left[first].iov_len == 0) ++first;
  }
  return absl::OkStatus();
}

absl::Status Socket::Send(const void* data, size_t size, absl::Time deadline) {
  iovec piece{const_cast<void*>(data), size};
  return Send(absl::MakeConstSpan(&piece, 1), deadline);
}

absl::Status Socket::SendTls(absl::Span<const iovec> pieces, absl::Time deadline) {
  std::string gathered;
  auto write = [&](const char* at, size_t size) -> absl::Status {
    while (size > 0) {
      size_t n = 0;
      const TlsResult r = TlsCall([&] { return SSL_write_ex(tls_->ssl, at, size, &n); });
      if (r.error == SSL_ERROR_NONE) {
        at += n;
        size -= n;
      } else if (absl::Status s = AwaitTls(r, deadline, stall_, "sending"); !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  };
  for (const iovec& piece : pieces) {
    const char* at = static_cast<const char*>(piece.iov_base);
    if (gathered.size() + piece.iov_len <= kGatherBytes) {
      gathered.append(at, piece.iov_len);
      continue;
    }
    if (absl::Status s = write(gathered.data(), gathered.size()); !s.ok()) return s;
    gathered.clear();
    if (absl::Status s = write(at, piece.iov_len); !s.ok()) return s;
  }
  return write(gathered.data(), gathered.size());
}

absl::Status Socket::Receive(void* data, size_t size, absl::Time deadline) {
  char* at = static_cast<char*>(data);
  if (tls_ != nullptr) return ReceiveTls(at, size, deadline);
  while (size > 0) {
    ssize_t n = recv(fd_, at, size, 0);
    if (n == 0) return absl::UnavailableError("the peer closed the connection");
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return absl::UnavailableError(absl::StrCat("receiving: ", Errno(errno)));
      }
      if (absl::Status s = Await(POLLIN, deadline, stall_, "receiving"); !s.ok()) return s;
      continue;
    }
    at += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status Socket::ReceiveTls(char* at, size_t size, absl::Time deadline) {
  while (size > 0) {
    size_t n = 0;
    const TlsResult r = TlsCall([&] { return SSL_read_ex(tls_->ssl, at, size, &n); });
    if (r.error == SSL_ERROR_NONE) {
      at += n;
      size -= n;
    } else if (absl::Status s = AwaitTls(r, deadline, stall_, "receiving"); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Socket::AwaitReadableTls(absl::Time deadline) {
  for (;;) {  // until a byte of a message is in (TLS's own records do not count)
    char byte;
    size_t n = 0;
    const TlsResult r = TlsCall([&] { return SSL_peek_ex(tls_->ssl, &byte, 1, &n); });
    if (r.error == SSL_ERROR_NONE) return absl::OkStatus();
    if (absl::Status s = AwaitTls(r, deadline, absl::InfiniteDuration(), "waiting for a message");
        !s.ok()) {
      return s;
    }
  }
}

void Socket::Shutdown() {
  shut_down_->store(true);
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
}

absl::StatusOr<std::unique_ptr<Listener>> Listener::Listen(const std::string& host, int port) {
  auto addresses = Resolve(host, port, /*passive=*/true);
  if (!addresses.ok()) return addresses.status();
  const addrinfo* a = addresses->get();
  int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", Errno(errno)));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
    int e = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", host, ":", port, ": ", Errno(e)));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port = bound.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                             : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::unique_ptr<Listener>(new Listener(fd, bound_port));
}

Listener::~Listener() { close(fd_); }

absl::StatusOr<Socket> Listener::Accept(absl::Time deadline, absl::Duration stall) {
  for (;;) {
    if (shut_down_.load()) return absl::CancelledError("the listener was shut down");
    int fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      if (absl::Status s = SetUp(fd); !s.ok()) {
        close(fd);
        return s;
      }
      return Socket(fd, stall);
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
      return absl::UnavailableError(absl::StrCat("accept: ", Errno(errno)));
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) return absl::DeadlineExceededError("no connection");
    // In slices, so that Shutdown is noticed soon.
    pollfd p{fd_, POLLIN, 0};
    poll(&p, 1, Millis(std::min(deadline - now, absl::Milliseconds(100))));
  }
}

void Listener::Shutdown() { shut_down_.store(true); }

}  // namespace ps
