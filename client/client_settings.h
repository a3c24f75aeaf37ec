// A client's settings, read and checked in one place: where the shards are ("ps", or a cluster
// spec "cluster" with "rank"), the model ("model", else the "hidden" MLP), credentials, wire
// types, compression, deadlines. They come as name -> text pairs named as the daemons' flags
// (without the dashes); the sources are thin adapters that make the pairs: the flags
// (client_flags.h), the C API's JSON (SettingsFromJson, capi/paramserver_c.h) and, through the C
// API, the Python package's environment (PS_NAME=value).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/sharded_client.h"
#include "common/model_identity.h"
#include "transport/security.h"

namespace ps {

// name -> text, as a flag's value is written ("h1:50051", "0.5", "true", "bf16"). An empty text
// is the same as an unset name.
using SettingTexts = std::map<std::string, std::string>;

// Every name ClientConnectionFromSettings takes, sorted.
const std::vector<std::string>& ClientSettingNames();

// How long a client retries a shard that fails ("retry_seconds" when unset): a daemon a minute
// (it may be restarting, or still starting); a one-shot tool 5 s; an interactive client (the C
// API's: a person may be waiting) a minute for a shard it reached, 10 s for one it never reached
// (a wrong address).
enum class ClientKind { kDaemon, kTool, kInteractive };

// What the caller needs of the settings, and how its users name them in messages.
struct SettingsUse {
  // Messages name a setting as its flag (--retry_seconds) rather than as a setting
  // ("retry_seconds").
  bool as_flags = false;
  // "ps" (or the cluster spec) must name at least one shard; else it may be unset.
  bool needs_shards = true;
  // "model" or "hidden" must be set (the flags always set --hidden, which has a default).
  bool needs_model = true;
  // Decides "retry_seconds" when it is unset.
  ClientKind kind = ClientKind::kDaemon;
};

// Where the shards are, the model they hold, and how to call them.
struct ClientConnection {
  std::vector<std::string> addresses;  // "ps", in shard order; empty when not needed
  std::string model;       // canonical spec (common/model_spec.h) of "model", else the "hidden" MLP
  ModelIdentity identity;  // of `model`, with num_shards the number of addresses
  int rank = -1;           // "rank": this worker's; -1: an observer
  absl::Duration heartbeat = absl::Seconds(1);  // "heartbeat_seconds"
  // Credentials, "num_workers", "push_dtype", "pull_dtype", "compress", "error_feedback",
  // "pull_compress", "shared_memory", "data_plane", "rpc_timeout_seconds", "retry_seconds".
  ClientOptions options;
};

// Checks `settings` and makes the connection they describe. With "cluster" (a cluster spec
// file), the spec supplies what the settings leave unset for this role: worker "rank" when
// rank >= 0, else the evaluator. A worker's own token must be that of "rank". Fails with a
// message that names the setting at fault (an unknown name, "setting \"retry_seconds\" must be a
// number, not \"x\"", no shards, an unreadable credential, ...).
absl::StatusOr<ClientConnection> ClientConnectionFromSettings(SettingTexts settings,
                                                              const SettingsUse& use);

// Only the credentials of `settings` ("tls_ca", "tls_cert", "tls_key", "token_file", else
// $PS_TOKEN), as ClientConnectionFromSettings loads them; other names are not looked at.
absl::StatusOr<ClientSecurity> ClientSecurityFromSettings(const SettingTexts& settings);

// The JSON adapter: a JSON object of settings as name -> text (strings as they are, numbers and
// booleans as JSON writes them; null: unset). Fails on anything but such an object, and on a
// name not in ClientSettingNames().
absl::StatusOr<SettingTexts> SettingsFromJson(absl::string_view json);

}  // namespace ps
