#include "transport/security.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log.h"

namespace ps {
namespace {

// The whole file at `path`, named by `flag` in errors.
absl::StatusOr<std::string> ReadWholeFile(absl::string_view flag, const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  std::string text;
  if (fd >= 0) {
    char buffer[4096];
    ssize_t n;
    while ((n = read(fd, buffer, sizeof buffer)) > 0) text.append(buffer, static_cast<size_t>(n));
    int read_errno = errno;
    close(fd);
    if (n == 0) return text;
    errno = read_errno;
  }
  return absl::NotFoundError(absl::StrCat("cannot read ", flag, "=", path, ": ", strerror(errno)));
}

// A PEM file that must hold at least one certificate.
absl::StatusOr<std::string> ReadCertificate(absl::string_view flag, const std::string& path) {
  absl::StatusOr<std::string> pem = ReadWholeFile(flag, path);
  if (pem.ok() && !HoldsCertificate(*pem)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, " holds no PEM certificate"));
  }
  return pem;
}

// cert/key PEM pair (both set): checks that the key parses and belongs to the certificate.
absl::Status ReadKeyPair(const TlsFiles& files, std::string* cert, std::string* key) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together: give both or neither");
  }
  absl::StatusOr<std::string> c = ReadCertificate("--tls_cert", files.cert);
  if (!c.ok()) return c.status();
  absl::StatusOr<std::string> k = ReadWholeFile("--tls_key", files.key);
  if (!k.ok()) return k.status();
  const KeyFit fit = CheckKey(*c, *k);
  if (fit == KeyFit::kNoKey) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_key=", files.key, " holds no (unencrypted) PEM private key"));
  }
  if (fit != KeyFit::kFits) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_key=", files.key, " does not belong to --tls_cert=", files.cert));
  }
  *cert = *std::move(c);
  *key = *std::move(k);
  return absl::OkStatus();
}

// A token from `file` (flag `flag`) if set, else from the environment variable `env` ("" if
// unset). Surrounding whitespace (a trailing newline) is dropped.
absl::StatusOr<std::string> LoadToken(absl::string_view flag, const std::string& file,
                                      const char* env) {
  std::string token, source;
  if (!file.empty()) {
    absl::StatusOr<std::string> text = ReadWholeFile(flag, file);
    if (!text.ok()) return text.status();
    token = *std::move(text);
    source = absl::StrCat(flag, "=", file);
  } else if (const char* value = std::getenv(env); value != nullptr) {
    token = value;
    source = env;
  } else {
    return std::string();
  }
  absl::StripAsciiWhitespace(&token);
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the token in ", source, " is empty"));
  }
  for (char ch : token) {
    // Call metadata carries printable ASCII only.
    if (ch < '!' || ch > '~') {
      return absl::InvalidArgumentError(
          absl::StrCat("the token in ", source, " must be printable ASCII without spaces"));
    }
  }
  return token;
}

}  // namespace

std::string BearerValue(absl::string_view token) { return absl::StrCat("Bearer ", token); }

namespace {
constexpr char kWorkerTokenPrefix[] = "worker-";
constexpr int kWorkerTokenHexDigits = 64;
}  // namespace

std::string WorkerToken(absl::string_view write_token, int rank) {
  const std::string message = absl::StrCat("paramserver worker ", rank);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), write_token.data(), static_cast<int>(write_token.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &length);
  std::string token = absl::StrCat(kWorkerTokenPrefix, rank, ":");
  for (unsigned int i = 0; i < length; ++i) absl::StrAppend(&token, absl::Hex(mac[i], absl::kZeroPad2));
  return token;
}

std::optional<int> WorkerTokenRank(absl::string_view token) {
  if (!absl::ConsumePrefix(&token, kWorkerTokenPrefix)) return std::nullopt;
  const size_t colon = token.find(':');
  int rank = -1;
  // Only the form WorkerToken writes: decimal digits without sign, space or leading zero.
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(token.substr(0, colon), &rank) ||
      rank < 0 || absl::StrCat(rank) != token.substr(0, colon) ||
      token.size() - colon - 1 != kWorkerTokenHexDigits) {
    return std::nullopt;
  }
  for (char ch : token.substr(colon + 1)) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(ch)) || absl::ascii_isupper(ch)) {
      return std::nullopt;
    }
  }
  return rank;
}

absl::Status CheckActsAs(const Caller& caller, int worker_id, absl::string_view call) {
  if (worker_id < 0 || caller.worker == Caller::kAnyWorker || caller.worker == worker_id) {
    return absl::OkStatus();
  }
  if (caller.worker >= 0) {
    return absl::PermissionDeniedError(absl::StrCat(call, ": worker ", caller.worker,
                                                    "'s token cannot act as worker ", worker_id));
  }
  return absl::PermissionDeniedError(absl::StrCat(
      call, " as worker ", worker_id,
      " needs that worker's own token: this job binds each worker to its token (ps "
      "--worker_identity), and the job's token acts as no worker (make worker ",
      worker_id, "'s with psctl worker-token --rank=", worker_id, ")"));
}

absl::StatusOr<TokenAuthenticator> TokenAuthenticator::Create(absl::string_view write_token,
                                                              absl::string_view read_token,
                                                              absl::string_view replication_token,
                                                              bool worker_identity) {
  if (write_token.empty() && read_token.empty() && replication_token.empty()) {
    return absl::InvalidArgumentError("no token given (use TokenAuthenticator() for none)");
  }
  if (worker_identity && write_token.empty()) {
    return absl::InvalidArgumentError(
        "--worker_identity needs the write token (--token_file or PS_TOKEN): workers' own "
        "tokens are made from it");
  }
  if (write_token.empty() && !read_token.empty()) {
    return absl::InvalidArgumentError(
        "a read-only token needs a write token too (--token_file or PS_TOKEN)");
  }
  if (!read_token.empty() && write_token == read_token) {
    return absl::InvalidArgumentError("the read-only token must differ from the write token");
  }
  if (!replication_token.empty() &&
      (replication_token == write_token || replication_token == read_token)) {
    return absl::InvalidArgumentError(
        "the replication token must differ from the write and read-only tokens (workers hold "
        "those; it lets a replica act on its peer)");
  }
  TokenAuthenticator a;
  if (!write_token.empty()) a.write_ = Sha256(write_token);
  if (!read_token.empty()) a.read_ = Sha256(read_token);
  if (!replication_token.empty()) a.replication_ = Sha256(replication_token);
  if (worker_identity) a.identity_key_ = std::string(write_token);
  return a;
}

TokenAuthenticator::Digest TokenAuthenticator::Sha256(absl::string_view text) {
  Digest d;
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), d.data());
  return d;
}

bool TokenAuthenticator::Equal(const Digest& a, const Digest& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::StatusOr<Caller> TokenAuthenticator::Authorize(absl::string_view authorization,
                                                     Access needed, absl::string_view call) const {
  const bool replicate = needed == Access::kReplicate;
  // Without a replication token, Replication calls are as open as the rest: no token at all is the
  // plaintext-loopback mode. With job tokens but none for replication, nobody may replicate.
  if (replicate ? !replication_.has_value() && !enabled() : !enabled()) {
    return Caller{Caller::kAnyWorker};
  }
  if (replicate && !replication_.has_value()) {
    return absl::PermissionDeniedError(
        absl::StrCat(call,
                     " needs the replication token, and this shard has none "
                     "(ps --replication_token_file or PS_REPLICATION_TOKEN)"));
  }
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        absl::StrCat(call, " needs a token (call metadata 'authorization: Bearer <token>')"));
  }
  if (!absl::ConsumePrefix(&authorization, "Bearer ")) {
    return absl::UnauthenticatedError(
        "malformed authorization metadata: expected 'Bearer <token>'");
  }
  Digest presented = Sha256(authorization);
  // Every comparison always runs, so the time taken does not tell which token matched. (Whether a
  // worker's token is made again depends on its form only, which is no secret.)
  bool is_write = write_.has_value() && Equal(presented, *write_);
  bool is_read = read_.has_value() && Equal(presented, *read_);
  bool is_replication = replication_.has_value() && Equal(presented, *replication_);
  std::optional<int> rank = WorkerTokenRank(authorization);
  bool is_worker = rank.has_value() && worker_identity() &&
                   Equal(presented, Sha256(WorkerToken(identity_key_, *rank)));
  if (replicate) {
    if (is_replication) return Caller{Caller::kNoWorker};
    if (!is_write && !is_read && !is_worker) {
      return absl::UnauthenticatedError(absl::StrCat(call, ": invalid token"));
    }
    return absl::PermissionDeniedError(absl::StrCat(
        call,
        " needs the replication credential (the token of ps --replication_token_file), which "
        "only the shard's replica peer holds; the job's write, read-only and workers' tokens do "
        "not allow ps.v1.Replication calls"));
  }
  if (is_write) return Caller{worker_identity() ? Caller::kNoWorker : Caller::kAnyWorker};
  if (is_worker) {
    if (needed == Access::kAdmin) {
      return absl::PermissionDeniedError(
          absl::StrCat(call, " needs the job's write token; worker ", *rank,
                       "'s own token allows that worker's calls only"));
    }
    return Caller{*rank};
  }
  if (is_replication) {
    return absl::PermissionDeniedError(absl::StrCat(
        call, ": the replication token allows only ps.v1.Replication calls between replicas"));
  }
  if (!is_read) {
    if (rank.has_value() && !worker_identity()) {
      return absl::UnauthenticatedError(absl::StrCat(
          call, ": invalid token (a worker's own token, but this shard does not bind workers to "
                "tokens: start it with --worker_identity, or give the worker the job's token)"));
    }
    return absl::UnauthenticatedError(absl::StrCat(call, ": invalid token"));
  }
  if (needed != Access::kRead) {
    return absl::PermissionDeniedError(
        absl::StrCat(call,
                     " needs the write token; the read-only token allows Pull and Register as an "
                     "observer and GetStats"));
  }
  return Caller{Caller::kNoWorker};
}

std::string ServerSecurity::Describe() const {
  return absl::StrCat(mutual_tls ? "mutual TLS"
                      : tls      ? "TLS (no client certificates)"
                                 : "plaintext",
                      ", ",
                      !tokens.enabled()         ? "no token"
                      : tokens.has_read_token() ? "write and read-only tokens"
                                                : "write token",
                      tokens.worker_identity() ? ", workers' own tokens" : "",
                      tokens.has_replication_token() ? ", replication token" : "");
}

absl::StatusOr<ServerSecurity> LoadServerSecurity(const TlsFiles& files,
                                                  const std::string& token_file,
                                                  const std::string& read_token_file,
                                                  const std::string& replication_token_file,
                                                  bool worker_identity) {
  ServerSecurity s;
  s.credentials = grpc::InsecureServerCredentials();
  if (!files.cert.empty() || !files.key.empty()) {
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    if (absl::Status st = ReadKeyPair(files, &pair.cert_chain, &pair.private_key); !st.ok()) {
      return st;
    }
    grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    options.pem_key_cert_pairs.push_back(std::move(pair));
    if (!files.ca.empty()) {
      absl::StatusOr<std::string> ca = ReadCertificate("--tls_ca", files.ca);
      if (!ca.ok()) return ca.status();
      options.pem_root_certs = *std::move(ca);
      options.client_certificate_request =
          GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
      s.mutual_tls = true;
    }
    absl::StatusOr<std::shared_ptr<const TlsContext>> plane =
        TlsContext::Create(TlsContext::Side::kServer, options.pem_key_cert_pairs[0].cert_chain,
                           options.pem_key_cert_pairs[0].private_key, options.pem_root_certs);
    if (!plane.ok()) return plane.status();
    s.plane_tls = *std::move(plane);
    s.credentials = grpc::SslServerCredentials(options);
    s.tls = true;
  } else if (!files.ca.empty()) {
    return absl::InvalidArgumentError("--tls_ca (mutual TLS) needs --tls_cert and --tls_key");
  }
  absl::StatusOr<std::string> write = LoadToken("--token_file", token_file, "PS_TOKEN");
  if (!write.ok()) return write.status();
  absl::StatusOr<std::string> read =
      LoadToken("--read_token_file", read_token_file, "PS_READ_TOKEN");
  if (!read.ok()) return read.status();
  absl::StatusOr<std::string> replication =
      LoadToken("--replication_token_file", replication_token_file, "PS_REPLICATION_TOKEN");
  if (!replication.ok()) return replication.status();
  if (worker_identity && write->empty()) {
    return absl::InvalidArgumentError(
        "--worker_identity needs the write token (--token_file or PS_TOKEN): workers' own "
        "tokens are made from it");
  }
  if (!write->empty() || !read->empty() || !replication->empty()) {
    absl::StatusOr<TokenAuthenticator> tokens =
        TokenAuthenticator::Create(*write, *read, *replication, worker_identity);
    if (!tokens.ok()) return tokens.status();
    s.tokens = *std::move(tokens);
  }
  s.replication_token = *std::move(replication);
  return s;
}

absl::StatusOr<ClientSecurity> LoadClientSecurity(const TlsFiles& files,
                                                  const std::string& token_file) {
  ClientSecurity s;
  if (!files.ca.empty()) {
    grpc::SslCredentialsOptions options;
    absl::StatusOr<std::string> ca = ReadCertificate("--tls_ca", files.ca);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
    if (!files.cert.empty() || !files.key.empty()) {
      if (absl::Status st = ReadKeyPair(files, &options.pem_cert_chain, &options.pem_private_key);
          !st.ok()) {
        return st;
      }
    }
    absl::StatusOr<std::shared_ptr<const TlsContext>> plane =
        TlsContext::Create(TlsContext::Side::kClient, options.pem_cert_chain,
                           options.pem_private_key, options.pem_root_certs);
    if (!plane.ok()) return plane.status();
    s.plane_tls = *std::move(plane);
    s.credentials = grpc::SslCredentials(options);
    s.tls = files;
  } else if (!files.cert.empty() || !files.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert/--tls_key need --tls_ca (the CA that signed the ps's certificate)");
  }
  absl::StatusOr<std::string> token = LoadToken("--token_file", token_file, "PS_TOKEN");
  if (!token.ok()) return token.status();
  s.token = *std::move(token);
  return s;
}

bool IsLoopbackHost(absl::string_view host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  in_addr address;
  return inet_pton(AF_INET, std::string(host).c_str(), &address) == 1 &&
         (ntohl(address.s_addr) >> 24) == 127;
}

absl::Status CheckListenHost(absl::string_view flag, absl::string_view host,
                             const ServerSecurity& security, bool insecure) {
  if (IsLoopbackHost(host)) return absl::OkStatus();
  if (!security.authenticates_callers()) {
    if (!insecure) {
      return absl::FailedPreconditionError(
          absl::StrCat("refusing to listen on ", flag, "=", host,
                       ": not a loopback address, and neither a token nor mutual TLS keeps "
                       "strangers out (pass --insecure to listen anyway)"));
    }
    PS_LOG(WARNING) << "--insecure: listening on " << flag << "=" << host
                    << " where anyone who can reach it gets in";
  } else if (!security.tls) {
    PS_LOG(WARNING) << "listening on " << flag << "=" << host
                    << " without TLS: the token travels in plaintext (give --tls_cert, --tls_key)";
  }
  return absl::OkStatus();
}

}  // namespace ps
