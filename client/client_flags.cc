#include "client/client_flags.h"

#include "absl/flags/flag.h"
#include "absl/flags/marshalling.h"
#include "client/health_server.h"
#include "common/log.h"

ABSL_FLAG(std::string, ps, "",
          "Shard addresses in shard order: host:port,host:port,... (a replicated shard: its two "
          "replicas as host:port/host:port).");
ABSL_FLAG(std::string, hidden, "256,128", "Hidden layer sizes of the MLP (the same everywhere).");
ABSL_FLAG(std::string, model, "",
          "The model, when not the --hidden MLP: a spec (mlp:784-256-10, "
          "cnn:1x28x28-conv32k5-pool2-fc128-10, grammar in common/network_spec.h) or a preset "
          "(cnn-small, cnn-large); for export_model and psctl also a tensor layout (a JSON file "
          "or object, common/tensor_layout.h) or flat:N. The same everywhere.");
ABSL_FLAG(double, retry_seconds, -1,
          "Give up after a shard has been unreachable this long; -1: 60 for the daemons (worker, "
          "evaluator), 5 for the one-shot tools (psctl, export_model).");
ABSL_FLAG(int, health_port, -1, "Serve grpc.health.v1 on this port (0: any free one; -1: off).");
ABSL_FLAG(std::string, health_host, "127.0.0.1",
          "Address of the health service (plaintext: anything but loopback needs --insecure).");
ABSL_FLAG(bool, insecure, false, "Allow a non-loopback --health_host (logs a warning).");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate that the ps certificates must chain to; turns TLS on.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate for shards that require one (mutual TLS); needs --tls_key.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, token_file, "",
          "File holding the token sent with every call (else $PS_TOKEN; neither: none). The "
          "evaluator needs only the shards' read-only token.");

ABSL_FLAG(std::string, pull_dtype, "fp32",
          "What pulled weights travel as: fp32 | bf16 | fp16 (half the bytes; the shard keeps "
          "float32).");

ABSL_FLAG(bool, shared_memory, true,
          "Move tensors through shared memory with shards on this host (the same kernel, user "
          "and PID namespace); false: over the data plane or gRPC.");
ABSL_FLAG(bool, data_plane, true,
          "Move tensors of the other shards over their data plane (a TCP connection of this "
          "client's beside its gRPC calls, at the link's rate); false: over gRPC's streams.");

namespace ps {

namespace {

// The flags above that are client settings, as their texts.
SettingTexts ClientFlagTexts() {
  SettingTexts settings = {
      {"ps", absl::GetFlag(FLAGS_ps)},
      {"model", absl::GetFlag(FLAGS_model)},
      {"hidden", absl::GetFlag(FLAGS_hidden)},
      {"tls_ca", absl::GetFlag(FLAGS_tls_ca)},
      {"tls_cert", absl::GetFlag(FLAGS_tls_cert)},
      {"tls_key", absl::GetFlag(FLAGS_tls_key)},
      {"token_file", absl::GetFlag(FLAGS_token_file)},
      {"pull_dtype", absl::GetFlag(FLAGS_pull_dtype)},
      {"shared_memory", absl::UnparseFlag(absl::GetFlag(FLAGS_shared_memory))},
      {"data_plane", absl::UnparseFlag(absl::GetFlag(FLAGS_data_plane))},
  };
  // -1 (the default) leaves the wait to the kind of client.
  if (const double retry = absl::GetFlag(FLAGS_retry_seconds); retry != -1) {
    settings["retry_seconds"] = absl::UnparseFlag(retry);
  }
  return settings;
}

// May the health service listen where asked (when it is on)?
absl::Status CheckHealthHost() {
  if (absl::GetFlag(FLAGS_health_port) < 0) return absl::OkStatus();
  return CheckListenHost("--health_host", absl::GetFlag(FLAGS_health_host), ServerSecurity{},
                         absl::GetFlag(FLAGS_insecure));
}

}  // namespace

absl::StatusOr<ClientSecurity> ClientSecurityFromFlags() {
  absl::StatusOr<ClientSecurity> security = ClientSecurityFromSettings(ClientFlagTexts());
  if (!security.ok()) return security.status();
  if (absl::Status s = CheckHealthHost(); !s.ok()) return s;
  return security;
}

absl::StatusOr<ClientConnection> ClientConnectionFromFlags(bool needs_shards, ClientKind kind,
                                                           const SettingTexts& own) {
  SettingsUse use;
  use.as_flags = true;
  use.needs_shards = needs_shards;
  use.needs_model = false;  // --hidden has a default
  use.kind = kind;
  SettingTexts settings = ClientFlagTexts();
  settings.insert(own.begin(), own.end());
  absl::StatusOr<ClientConnection> connection = ClientConnectionFromSettings(settings, use);
  if (!connection.ok()) return connection.status();
  if (absl::Status s = CheckHealthHost(); !s.ok()) return s;
  return connection;
}

absl::StatusOr<std::unique_ptr<grpc::Server>> StartHealthFromFlags() {
  int port = absl::GetFlag(FLAGS_health_port);
  if (port < 0) return nullptr;
  absl::StatusOr<std::unique_ptr<grpc::Server>> health =
      StartHealthServer(absl::GetFlag(FLAGS_health_host), port, &port);
  if (health.ok()) PS_LOG(INFO) << "health service on port " << port;
  return health;
}

}  // namespace ps
