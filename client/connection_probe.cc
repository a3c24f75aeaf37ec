#include "client/connection_probe.h"

#include <fcntl.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cluster.h"

namespace ps {
namespace {

// A TCP connection to host:port within `timeout`: the socket (blocking, with send and receive
// timeouts), or -1 with the reason in *why.
int Connect(const std::string& host, const std::string& port, absl::Duration timeout,
            std::string* why) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int e = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); e != 0) {
    *why = absl::StrCat("cannot resolve ", host, ": ", gai_strerror(e));
    return -1;
  }
  const int ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int error = connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (error == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, ms) == 1) {
        socklen_t length = sizeof error;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      } else {
        error = ETIMEDOUT;
      }
    }
    if (error != 0) {
      close(fd);
      fd = -1;
      *why = error == ECONNREFUSED
                 ? absl::StrCat("connection refused: nothing listens on ", host, ":", port,
                                " (the shard is down or not started yet)")
             : error == ETIMEDOUT
                 ? absl::StrCat("no answer from ", host, ":", port, " within ",
                                absl::FormatDuration(timeout),
                                " (the host is down, a firewall drops the connection, or the "
                                "address is wrong)")
                 : absl::StrCat("cannot connect to ", host, ":", port, ": ", strerror(error));
    }
  }
  freeaddrinfo(found);
  if (fd >= 0) {
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    timeval t{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof t);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &t, sizeof t);
  }
  return fd;
}

struct SslCtxDeleter {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
struct SslDeleter {
  void operator()(SSL* s) const { SSL_free(s); }
};

// What one probe of a shard found.
struct Attempt {
  enum Kind {
    kUnreachable,  // no TCP connection (cause says why)
    kInconclusive,  // connected, but nothing proves a mismatch (a timeout, a reset, a close
                    // during the handshake: a shard starting, stopping or busy looks the same)
    kFits,          // the TLS settings fit
    kClosedAfterHandshake,  // a TLS shard closed the connection right after the handshake
    kMismatch,              // definite: an alert, a certificate check, non-TLS bytes
  } kind;
  std::string cause;
};

// The mismatch a definite OpenSSL error shows, or nullopt when it proves nothing.
std::optional<std::string> Mismatch(unsigned long error, SSL* ssl, const ClientSecurity& security,
                                    const std::string& host) {
  switch (ERR_GET_REASON(error)) {
    case SSL_R_CERTIFICATE_VERIFY_FAILED: {
      const long verify = SSL_get_verify_result(ssl);
      if (verify == X509_V_ERR_HOSTNAME_MISMATCH) {
        return absl::StrCat("the shard's certificate does not name ", host,
                            " (its subjectAltName must list the address clients use)");
      }
      return absl::StrCat("the shard's certificate is not trusted by --tls_ca=", security.tls.ca,
                          " (", X509_verify_cert_error_string(verify),
                          "): give the CA that signed the shards' certificates");
    }
    case SSL_R_WRONG_VERSION_NUMBER:
    case SSL_R_PACKET_LENGTH_TOO_LONG:  // the shard answered with bytes that are not TLS
      return std::string(
          "the shard does not speak TLS (it serves plaintext) and this client uses TLS "
          "(--tls_ca): give both the same settings");
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
    case SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE:
      if (security.tls.cert.empty()) {
        return std::string(
            "the shard requires a client certificate (mutual TLS) and this client gave none: "
            "give --tls_cert and --tls_key");
      }
      return std::nullopt;
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_TLSV1_ALERT_DECRYPT_ERROR:
    case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
      return absl::StrCat("the shard refused this client's certificate (--tls_cert=",
                          security.tls.cert,
                          "): it is not signed by the CA the shard trusts (ps --tls_ca)");
    default:
      return std::nullopt;
  }
}

Attempt ProbeOnce(const std::string& host, const std::string& port,
                  const ClientSecurity& security, absl::Duration timeout) {
  std::string why;
  const int fd = Connect(host, port, timeout, &why);
  if (fd < 0) return {Attempt::kUnreachable, why};
  const bool tls = !security.tls.ca.empty();
  std::unique_ptr<SSL_CTX, SslCtxDeleter> ctx(SSL_CTX_new(TLS_client_method()));
  if (ctx != nullptr && tls) {
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
    SSL_CTX_load_verify_locations(ctx.get(), security.tls.ca.c_str(), nullptr);
    if (!security.tls.cert.empty()) {
      SSL_CTX_use_certificate_chain_file(ctx.get(), security.tls.cert.c_str());
      SSL_CTX_use_PrivateKey_file(ctx.get(), security.tls.key.c_str(), SSL_FILETYPE_PEM);
    }
  }
  std::unique_ptr<SSL, SslDeleter> ssl(ctx != nullptr ? SSL_new(ctx.get()) : nullptr);
  if (ssl == nullptr) {
    close(fd);
    return {Attempt::kInconclusive, ""};
  }
  static const unsigned char kAlpn[] = {2, 'h', '2'};
  SSL_set_alpn_protos(ssl.get(), kAlpn, sizeof kAlpn);
  SSL_set_tlsext_host_name(ssl.get(), host.c_str());
  if (tls) SSL_set1_host(ssl.get(), host.c_str());
  SSL_set_fd(ssl.get(), fd);
  ERR_clear_error();
  Attempt attempt{Attempt::kInconclusive, ""};
  if (SSL_connect(ssl.get()) == 1) {
    if (!tls) {
      attempt = {Attempt::kMismatch,
                 "the shard serves TLS and this client connects in plaintext: give --tls_ca (the "
                 "CA of the shards' certificates), and --tls_cert/--tls_key if the shard requires "
                 "client certificates"};
    } else {
      // Under TLS 1.3 a shard checks the client's certificate after the client's handshake
      // ends: a refusal arrives as an alert, or (gRPC's) as a close, on the first read; a shard
      // that serves the client sends its HTTP/2 settings first.
      char byte;
      const int read = SSL_read(ssl.get(), &byte, 1);
      const int error = SSL_get_error(ssl.get(), read);
      const unsigned long e = ERR_peek_error();
      if (read > 0) {
        attempt = {Attempt::kFits, ""};
      } else if (std::optional<std::string> m =
                     e != 0 ? Mismatch(e, ssl.get(), security, host) : std::nullopt) {
        attempt = {Attempt::kMismatch, *m};
      } else if (error == SSL_ERROR_ZERO_RETURN ||
                 (error == SSL_ERROR_SYSCALL && e == 0 && errno == 0) ||
                 (e != 0 && ERR_GET_REASON(e) == SSL_R_UNEXPECTED_EOF_WHILE_READING)) {
        attempt = {Attempt::kClosedAfterHandshake, ""};
      }
    }
  } else if (tls && ERR_peek_error() != 0) {
    if (std::optional<std::string> m = Mismatch(ERR_peek_error(), ssl.get(), security, host)) {
      attempt = {Attempt::kMismatch, *m};
    }
  }
  ERR_clear_error();
  close(fd);
  return attempt;
}

}  // namespace

ProbeFinding ProbeShard(const std::string& address, const ClientSecurity& security,
                        absl::Duration timeout) {
  std::string host, port;
  if (!SplitHostPort(address, &host, &port)) return {};
  Attempt attempt = ProbeOnce(host, port, security, timeout);
  if (attempt.kind == Attempt::kClosedAfterHandshake) {
    // A shard that was stopping would not do it twice, a second apart.
    absl::SleepFor(absl::Seconds(1));
    attempt = ProbeOnce(host, port, security, timeout);
  }
  switch (attempt.kind) {
    case Attempt::kUnreachable:
      return {false, attempt.cause};
    case Attempt::kMismatch:
      return {true, attempt.cause};
    case Attempt::kClosedAfterHandshake:
      return {true, security.tls.cert.empty()
                        ? std::string("the shard closed the connection after the TLS handshake, "
                                      "twice: it requires a client certificate (mutual TLS), "
                                      "and this client gave none: give --tls_cert and --tls_key")
                        : absl::StrCat("the shard closed the connection after the TLS handshake, "
                                       "twice: it refused this client's certificate (--tls_cert=",
                                       security.tls.cert,
                                       "), which is not signed by the CA it trusts (ps --tls_ca)")};
    default:
      return {};
  }
}

}  // namespace ps
