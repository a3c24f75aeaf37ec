// Why a client cannot reach a shard, when gRPC only says "failed to connect to all addresses ...
// Socket closed": a TCP connection and a TLS handshake of the probe's own to the shard's
// address, with the client's TLS settings, tell a shard that is down (connection refused, no
// answer) from one that refuses this client's TLS (the shard serves TLS and the client does not,
// or the reverse; the shard's certificate is not from the client's CA or does not name the host;
// the shard requires a client certificate, or does not trust the one given). A mismatch of TLS
// settings never heals by itself, so a client can stop at once and say so instead of retrying;
// it is reported only on definite evidence (a TLS alert, a failed certificate check, bytes that
// are not TLS, or a close right after the handshake twice, a second apart): a timeout, a reset or
// a close during the handshake, which a shard starting, stopping or busy also gives, proves
// nothing. Thread-safe (no state).
#pragma once

#include <string>

#include "absl/time/time.h"
#include "transport/security.h"

namespace ps {

struct ProbeFinding {
  bool misconfigured = false;  // this client's or the shard's TLS settings do not fit together
  std::string cause;           // one line naming it; "" when the probe found nothing wrong
};

// Probes `address` ("host:port") with `security` (its `tls` files; no CA: plaintext), each step
// bounded by `timeout` (at most about 3 x timeout + 1 s in all).
ProbeFinding ProbeShard(const std::string& address, const ClientSecurity& security,
                        absl::Duration timeout = absl::Seconds(2));

}  // namespace ps
