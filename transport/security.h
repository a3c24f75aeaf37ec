// Who may talk to a parameter server: TLS credentials built from PEM files (server-only or mutual),
// shared-secret bearer tokens (a write token, an optional read-only one, the replication token a
// shard's two replicas prove themselves to each other with, and with per-worker identity each
// worker's own token, derived from the write token) compared in constant time, and the rule for
// which addresses a daemon may listen on. Errors name the files by the daemons' flags
// (--tls_cert, --tls_key, --tls_ca, --token_file, --read_token_file, --replication_token_file).
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <array>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transport/tls.h"

namespace ps {

// Paths of PEM files for one end of a TLS connection; all empty means plaintext.
struct TlsFiles {
  std::string cert;  // this end's certificate (chain); server: turns TLS on; client: mutual TLS
  std::string key;   // the certificate's private key
  std::string ca;    // server: clients must present a certificate chaining to it (mutual TLS);
                     // client: the server's certificate must chain to it (turns TLS on)
};

// Clients send their token as this call metadata: "authorization: Bearer <token>".
inline constexpr char kAuthorizationMetadata[] = "authorization";
std::string BearerValue(absl::string_view token);

// What a call needs: kRead (Pull as an observer, GetStats, Register as an observer), kWrite
// (a worker's calls and Initialize), kAdmin (Checkpoint: the write token, never a worker's own),
// or kReplicate (ps.v1.Replication: only a shard's replica peer, with the replication token; the
// job's tokens never allow it).
enum class Access { kRead, kWrite, kAdmin, kReplicate };

// Per-worker identity (ps --worker_identity): each worker holds a token of its own, which acts as
// that worker only; the job's write token then acts as no worker (it stays the operator's). A
// worker's token is "worker-<rank>:" and 64 hex digits of HMAC-SHA256(the job's write token,
// "paramserver worker <rank>"): whoever holds the write token can make any (launch, psctl
// worker-token), and a shard checks one by making it again, so it stores nothing per worker.
std::string WorkerToken(absl::string_view write_token, int rank);
// The rank a token names if it has the form of a worker's token; nullopt otherwise. Says nothing
// about whether it is genuine.
std::optional<int> WorkerTokenRank(absl::string_view token);

// Which worker a caller whose token checked out may act as (TokenAuthenticator::Authorize).
struct Caller {
  static constexpr int kAnyWorker = -1;  // the write token without per-worker identity; no tokens
  static constexpr int kNoWorker = -2;   // the read-only token; the write token with identity
  int worker = kNoWorker;                // >= 0: that worker's own token
};
// OK if `caller` may make `call` as worker `worker_id` (negative: as an observer, always OK);
// PERMISSION_DENIED naming both otherwise.
absl::Status CheckActsAs(const Caller& caller, int worker_id, absl::string_view call);

// Decides from a call's authorization metadata whether the caller may do what it asks, and as
// which worker. Holds SHA-256 digests of the tokens (and, with per-worker identity, the write
// token, the key workers' tokens derive from) and compares digests in constant time, so neither
// the tokens' contents nor their lengths leak through timing. Immutable after construction: thread-safe.
class TokenAuthenticator {
 public:
  // No tokens: every caller may do everything.
  TokenAuthenticator() = default;
  // `read_token` ("": none) needs a `write_token`; `replication_token` ("": none) may stand alone
  // (a job without tokens whose replicas still authenticate each other). Nonempty tokens must all
  // differ. `worker_identity` (needs a write token): workers' own tokens are accepted, and the
  // write token acts as no worker. INVALID_ARGUMENT otherwise, or when all three are empty.
  static absl::StatusOr<TokenAuthenticator> Create(absl::string_view write_token,
                                                   absl::string_view read_token,
                                                   absl::string_view replication_token = "",
                                                   bool worker_identity = false);

  // Whether ParameterServer calls need a token (there is a write token).
  bool enabled() const { return write_.has_value(); }
  bool has_read_token() const { return read_.has_value(); }
  bool has_replication_token() const { return replication_.has_value(); }
  bool worker_identity() const { return !identity_key_.empty(); }

  // Whom the caller presenting `authorization` (the metadata value, "" if absent) acts as, if it
  // may do `call`, which needs `needed`. UNAUTHENTICATED: no, malformed or unknown token.
  // PERMISSION_DENIED: the read-only token for a call that needs kWrite or kAdmin; a worker's own
  // token for kAdmin; the replication token for anything but kReplicate (when enabled()); the
  // job's tokens for kReplicate, and any caller for kReplicate when enabled() without a
  // replication token (fails closed). Without any token everything is allowed (kAnyWorker).
  // `call` names the call in messages.
  absl::StatusOr<Caller> Authorize(absl::string_view authorization, Access needed,
                                   absl::string_view call) const;

 private:
  using Digest = std::array<unsigned char, 32>;
  static Digest Sha256(absl::string_view text);
  static bool Equal(const Digest& a, const Digest& b);  // constant time

  std::optional<Digest> write_, read_, replication_;
  // With per-worker identity: the write token, which workers' tokens derive from; "" without.
  std::string identity_key_;
};

// The ps's side of security, from its flags: the listening port's credentials and the tokens.
struct ServerSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;  // TLS or plaintext
  std::shared_ptr<const TlsContext> plane_tls;           // the same for the data plane; null: none
  TokenAuthenticator tokens;
  bool tls = false, mutual_tls = false;
  // Whether strangers are kept out: mutual TLS or a token (server-only TLS encrypts but lets any
  // client in).
  bool authenticates_callers() const { return mutual_tls || tokens.enabled(); }
  // The replication token itself, for this process's own calls to its replica peer; "": none.
  std::string replication_token;
  // For the log: "mutual TLS, write+read tokens", "plaintext, no token", ...
  std::string Describe() const;
};

// Builds the ps's security. TLS when files.cert/files.key are set (both or neither); mutual TLS
// when files.ca is set too. The write token comes from `token_file`, else the environment variable
// PS_TOKEN; the read-only token from `read_token_file`, else PS_READ_TOKEN; a read-only token needs
// a write token. The replication token comes from `replication_token_file`, else
// PS_REPLICATION_TOKEN. `worker_identity` (needs the write token) accepts workers' own tokens (see
// WorkerToken). Fails with a one-line reason for a missing or unreadable file, a file that
// holds no PEM certificate or key, a key that does not match its certificate, an empty token, or
// two equal tokens.
absl::StatusOr<ServerSecurity> LoadServerSecurity(const TlsFiles& files,
                                                  const std::string& token_file,
                                                  const std::string& read_token_file,
                                                  const std::string& replication_token_file = "",
                                                  bool worker_identity = false);

// A client's side (worker, evaluator, tests): channel credentials and the token it sends.
struct ClientSecurity {
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null: plaintext
  std::shared_ptr<const TlsContext> plane_tls;  // the same for data-plane connections; null: none
  std::string token;                            // "": none sent
  TlsFiles tls;  // the files `credentials` came from, to name them and probe with (connection_probe.h)
};

// Builds a client's security. TLS when files.ca is set (the CA that signed the ps's certificate);
// files.cert/files.key (both or neither, and only with files.ca) add a client certificate for
// mutual TLS. The token comes from `token_file`, else PS_TOKEN, else none. Fails as
// LoadServerSecurity does.
absl::StatusOr<ClientSecurity> LoadClientSecurity(const TlsFiles& files,
                                                  const std::string& token_file);

// True for addresses only this machine reaches: 127.0.0.0/8, ::1 and "localhost".
bool IsLoopbackHost(absl::string_view host);

// May a server protected by `security` listen on `host` (given as `flag`, e.g. "--host")?
// Loopback: always. Any other address: only if security.authenticates_callers(), or if `insecure`
// (then it logs a warning); a token without TLS is let through with a warning that it travels in
// plaintext. Otherwise FAILED_PRECONDITION with a one-line reason. Health-only servers pass
// ServerSecurity{} (plaintext, no tokens).
absl::Status CheckListenHost(absl::string_view flag, absl::string_view host,
                             const ServerSecurity& security, bool insecure);

}  // namespace ps
