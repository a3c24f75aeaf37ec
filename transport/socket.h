// A TCP connection for bulk bytes, with an end to every wait: each operation takes a deadline,
// and a peer that moves no byte for a connection's `stall` limit fails it too. Used by the data
// plane (transport/data_frames.h) on both sides.
//
// One thread may send while another receives; two senders (or two receivers) need a lock of
// their own. Shutdown() is thread-safe and makes every wait in progress or later fail at once.
// Secure() makes it a TLS connection (transport/tls.h) with the same contract.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace ps {

class TlsContext;

class Socket {
 public:
  Socket();
  // Takes `fd`, a connected stream socket; `stall`: how long a wait may see no progress.
  Socket(int fd, absl::Duration stall);
  Socket(Socket&& o) noexcept;
  Socket& operator=(Socket&& o) noexcept;
  ~Socket();

  // Connects to host:port (a name or an address) before `deadline`. UNAVAILABLE naming the
  // address and the reason otherwise.
  static absl::StatusOr<Socket> Connect(const std::string& host, int port, absl::Time deadline,
                                        absl::Duration stall);

  bool valid() const { return fd_ >= 0; }
  // Makes this a TLS connection as `tls`'s side: the handshake, before `deadline`; from then on
  // Send and Receive encrypt and decrypt (a lock in here takes the sender's and the receiver's
  // TLS calls in turn), and AwaitReadable waits for a message's bytes, not TLS's own records. A
  // client checks that the server's certificate names `peer_host` (a name or an address, as gRPC
  // checks its target; INVALID_ARGUMENT when empty). UNAVAILABLE saying why otherwise (a
  // certificate not trusted, a peer that does not speak TLS or refused this end's certificate),
  // DEADLINE_EXCEEDED as Receive's. A socket whose Secure failed is of no further use.
  absl::Status Secure(const TlsContext& tls, const std::string& peer_host, absl::Time deadline);
  // Sends every byte of `pieces` in order. UNAVAILABLE when the peer went away or the connection
  // was shut down, DEADLINE_EXCEEDED at `deadline` or after `stall` without progress.
  absl::Status Send(absl::Span<const iovec> pieces, absl::Time deadline);
  absl::Status Send(const void* data, size_t size, absl::Time deadline);
  // Receives exactly `size` bytes into `data`; fails as Send does (UNAVAILABLE also when the peer
  // closed the connection before all of them came).
  absl::Status Receive(void* data, size_t size, absl::Time deadline);
  // Waits, with no stall limit, until bytes arrive (or the peer closed the connection) or
  // `deadline`: for a connection that may rest between messages. DEADLINE_EXCEEDED at `deadline`,
  // UNAVAILABLE once shut down.
  absl::Status AwaitReadable(absl::Time deadline);
  // Ends the connection both ways: waits in progress and later ones fail (UNAVAILABLE).
  void Shutdown();
  // Whether Shutdown was called.
  bool shut_down() const { return shut_down_->load(); }
  // Changes the stall limit of later waits; before other threads use the socket.
  void set_stall(absl::Duration stall) { stall_ = stall; }

 private:
  // Waits until the socket is ready for `events` (POLLIN or POLLOUT), at most until `deadline`
  // and for `stall`; `what` names the wait in errors.
  absl::Status Await(short events, absl::Time deadline, absl::Duration stall, const char* what);
  // The TLS versions of Send, Receive and AwaitReadable.
  absl::Status SendTls(absl::Span<const iovec> pieces, absl::Time deadline);
  absl::Status ReceiveTls(char* at, size_t size, absl::Time deadline);
  absl::Status AwaitReadableTls(absl::Time deadline);
  // How a TLS call ended: SSL_ERROR_NONE or what SSL_get_error said of it, and errno then.
  struct TlsResult {
    int error = 0;
    int sys_error = 0;
  };
  // Runs one TLS call (`call`, returning OpenSSL's result) under the TLS lock.
  template <typename Call>
  TlsResult TlsCall(Call call);
  // Waits as a TLS call that ended with `r` (SSL_ERROR_WANT_READ or _WRITE) asks; UNAVAILABLE
  // naming `what` and the reason (the peer's close, errno's, OpenSSL's) for any other ending.
  absl::Status AwaitTls(TlsResult r, absl::Time deadline, absl::Duration stall, const char* what);

  struct Tls;  // the OpenSSL connection and its lock
  std::unique_ptr<Tls> tls_;
  int fd_ = -1;
  absl::Duration stall_;
  std::unique_ptr<std::atomic<bool>> shut_down_ = std::make_unique<std::atomic<bool>>(false);
};

// A listening TCP socket on host:port (port 0: a free one). Accept waits until `deadline` and
// returns DEADLINE_EXCEEDED when none came. Shutdown() (thread-safe) ends Accept at once.
class Listener {
 public:
  static absl::StatusOr<std::unique_ptr<Listener>> Listen(const std::string& host, int port);
  ~Listener();
  int port() const { return port_; }
  absl::StatusOr<Socket> Accept(absl::Time deadline, absl::Duration stall);
  void Shutdown();

 private:
  Listener(int fd, int port) : fd_(fd), port_(port) {}
  int fd_;
  int port_;
  std::atomic<bool> shut_down_{false};
};

}  // namespace ps
