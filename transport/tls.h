// TLS for the data plane's TCP connections (transport/socket.h: Socket::Secure), made from the same
// PEM files as the job's gRPC credentials (transport/security.h builds both), so that a job that
// uses TLS keeps it for its tensors too. TLS 1.3 only (both ends are this project's), no session
// tickets (connections are few and long), OpenSSL's default cipher suites.
//
// Immutable after Create: thread-safe, shared by every connection made with it.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

struct ssl_ctx_st;

namespace ps {

class TlsContext {
 public:
  enum class Side { kServer, kClient };
  // `cert_chain` and `key` (PEM): this end's certificate (chain) and its private key, a server's
  // always, a client's only for mutual TLS ("" both: none). `ca` (PEM): a client's, the CA the
  // server's certificate must chain to (required); a server's, the CA clients must present a
  // certificate chaining to (mutual TLS; "": none asked for). INVALID_ARGUMENT saying what does
  // not parse or fit (a key that is not the certificate's).
  static absl::StatusOr<std::shared_ptr<const TlsContext>> Create(Side side,
                                                                  const std::string& cert_chain,
                                                                  const std::string& key,
                                                                  const std::string& ca);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  Side side() const { return side_; }
  // OpenSSL's context, for Socket::Secure.
  ssl_ctx_st* get() const { return ctx_; }

 private:
  TlsContext(Side side, ssl_ctx_st* ctx) : side_(side), ctx_(ctx) {}
  const Side side_;
  ssl_ctx_st* const ctx_;
};

// OpenSSL's reason for the last error on this thread's queue, or `otherwise` when there is none.
std::string TlsErrorReason(const char* otherwise);

// Checks of the job's PEM files (transport/security.cc reads them): whether `pem` holds a
// certificate; whether `key` holds an (unencrypted) private key, and one that belongs to the
// first certificate in `cert`.
bool HoldsCertificate(const std::string& pem);
enum class KeyFit { kNoKey, kNotTheCertificates, kFits };
KeyFit CheckKey(const std::string& cert, const std::string& key);

}  // namespace ps
