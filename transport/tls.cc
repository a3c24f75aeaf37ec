#include "transport/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
using Bio = std::unique_ptr<BIO, BioDeleter>;

Bio MemoryBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

// Every certificate in `pem`, in order (the error its end reads as cleared, so that a later
// error is the one reported).
std::vector<std::unique_ptr<X509, X509Deleter>> Certificates(const std::string& pem) {
  Bio bio = MemoryBio(pem);
  std::vector<std::unique_ptr<X509, X509Deleter>> all;
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) all.emplace_back(x);
  ERR_clear_error();
  return all;
}

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("TLS for the data plane: ", what, ": ", TlsErrorReason("no detail")));
}

}  // namespace

std::string TlsErrorReason(const char* otherwise) {
  const unsigned long e = ERR_peek_last_error();
  if (e == 0) return otherwise;
  const char* reason = ERR_reason_error_string(e);
  return reason != nullptr ? reason : absl::StrCat("OpenSSL error ", e);
}

absl::StatusOr<std::shared_ptr<const TlsContext>> TlsContext::Create(Side side,
                                                                     const std::string& cert_chain,
                                                                     const std::string& key,
                                                                     const std::string& ca) {
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(side == Side::kServer ? TLS_server_method() : TLS_client_method());
  if (ctx == nullptr) return Invalid("no context");
  std::shared_ptr<const TlsContext> context(new TlsContext(side, ctx));
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  // An end that closes without close_notify reads as a closed connection, as over plain TCP.
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  if (side == Side::kServer) SSL_CTX_set_num_tickets(ctx, 0);  // nothing after the handshake
  if (!cert_chain.empty()) {
    const auto chain = Certificates(cert_chain);
    bool ok = !chain.empty();
    for (size_t i = 0; ok && i < chain.size(); ++i) {
      ok = (i == 0 ? SSL_CTX_use_certificate(ctx, chain[i].get())
                   : SSL_CTX_add1_chain_cert(ctx, chain[i].get())) == 1;
    }
    if (!ok) return Invalid("this end's certificate");
    Bio bio = MemoryBio(key);
    EVP_PKEY* pkey = PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr);
    ok = pkey != nullptr && SSL_CTX_use_PrivateKey(ctx, pkey) == 1;
    EVP_PKEY_free(pkey);
    if (!ok || SSL_CTX_check_private_key(ctx) != 1) return Invalid("this end's private key");
  } else if (side == Side::kServer) {
    return absl::InvalidArgumentError("TLS for the data plane: a server needs a certificate");
  }
  if (!ca.empty()) {
    X509_STORE* store = SSL_CTX_get_cert_store(ctx);
    const auto authorities = Certificates(ca);
    bool ok = !authorities.empty();
    for (const auto& x : authorities) ok = ok && X509_STORE_add_cert(store, x.get()) == 1;
    if (!ok) return Invalid("the CA");
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  } else if (side == Side::kClient) {
    return absl::InvalidArgumentError("TLS for the data plane: a client needs the CA");
  }
  return context;
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

bool HoldsCertificate(const std::string& pem) { return !Certificates(pem).empty(); }

KeyFit CheckKey(const std::string& cert, const std::string& key) {
  std::unique_ptr<EVP_PKEY, KeyDeleter> parsed(
      PEM_read_bio_PrivateKey(MemoryBio(key).get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (parsed == nullptr) return KeyFit::kNoKey;
  const auto chain = Certificates(cert);
  return !chain.empty() && X509_check_private_key(chain[0].get(), parsed.get()) == 1
             ? KeyFit::kFits
             : KeyFit::kNotTheCertificates;
}

}  // namespace ps
