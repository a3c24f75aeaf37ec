#include "client/client_settings.h"

#include <algorithm>
#include <optional>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cluster.h"
#include "common/cluster_spec.h"
#include "common/compression.h"
#include "common/model_spec.h"
#include "common/wire_type.h"
#include "nlohmann/json.hpp"

namespace ps {

namespace {

// Typed values out of the texts; messages name a setting as its user knows it.
class SettingReader {
 public:
  SettingReader(const SettingTexts& texts, bool as_flags) : texts_(texts), as_flags_(as_flags) {}

  // The text of `name`; "" when unset.
  std::string Text(const std::string& name) const {
    auto it = texts_.find(name);
    return it == texts_.end() ? "" : it->second;
  }

  // "--name" or "name", to start a message with.
  std::string Name(const std::string& name) const { return (as_flags_ ? "--" : "") + name; }

  // "--name" or "setting \"name\"", for a value of the wrong kind.
  std::string Setting(const std::string& name) const {
    return as_flags_ ? "--" + name : absl::StrCat("setting \"", name, "\"");
  }

  // The number `name` holds; `fallback` when unset.
  template <typename T>
  absl::StatusOr<T> Number(const std::string& name, T fallback) const {
    const std::string text = Text(name);
    if (text.empty()) return fallback;
    T value;
    bool parsed;
    if constexpr (std::is_floating_point_v<T>) {
      parsed = absl::SimpleAtod(text, &value);
    } else {
      parsed = absl::SimpleAtoi(text, &value);
    }
    if (!parsed) {
      return absl::InvalidArgumentError(
          absl::StrCat(Setting(name), " must be a number, not \"", text, "\""));
    }
    return value;
  }

  // Sets *value from `name` (as a flag takes a boolean: true/false, yes/no, 1/0) when set.
  absl::Status Bool(const std::string& name, bool* value) const {
    const std::string text = Text(name);
    if (!text.empty() && !absl::SimpleAtob(text, value)) {
      return absl::InvalidArgumentError(absl::StrCat(Setting(name), " must be true or false"));
    }
    return absl::OkStatus();
  }

  // A non-negative number of seconds (positive when `positive`), `fallback` when unset.
  absl::StatusOr<absl::Duration> Seconds(const std::string& name, absl::Duration fallback,
                                         bool positive = false) const {
    absl::StatusOr<double> seconds = Number(name, absl::ToDoubleSeconds(fallback));
    if (!seconds.ok()) return seconds.status();
    if (positive ? !(*seconds > 0) : !(*seconds >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(Name(name), positive ? " must be > 0" : " must be >= 0"));
    }
    return absl::Seconds(*seconds);
  }

 private:
  const SettingTexts& texts_;
  const bool as_flags_;
};

bool IsSettingName(const std::string& name) {
  return std::binary_search(ClientSettingNames().begin(), ClientSettingNames().end(), name);
}

absl::Status CheckNames(const SettingTexts& settings) {
  for (const auto& [name, text] : settings) {
    if (!IsSettingName(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown setting \"", name,
                       "\" (known: ", absl::StrJoin(ClientSettingNames(), ", "), ")"));
    }
  }
  return absl::OkStatus();
}

// Adds what a cluster spec gives this role (shards, model, workers, credentials), where the
// settings do not say otherwise.
absl::Status AddClusterSpec(int rank, SettingTexts* settings) {
  absl::StatusOr<ClusterSpec> spec = ReadClusterSpec((*settings)["cluster"]);
  if (!spec.ok()) return spec.status();
  absl::StatusOr<std::vector<std::string>> flags =
      rank >= 0 ? FlagsForRole(*spec, "worker", absl::StrCat("worker:", rank))
                : FlagsForRole(*spec, "evaluator", "evaluator");
  if (!flags.ok()) return flags.status();
  for (const std::string& flag : *flags) {
    const size_t eq = flag.find('=');
    if (flag.rfind("--", 0) != 0 || eq == std::string::npos) continue;
    const std::string name = flag.substr(2, eq - 2);
    if (IsSettingName(name) && (*settings)[name].empty()) {
      (*settings)[name] = flag.substr(eq + 1);
    }
  }
  return absl::OkStatus();
}

// "ps" in shard order; empty when unset and not needed.
absl::StatusOr<std::vector<std::string>> Shards(const SettingReader& s, const SettingsUse& use) {
  const std::string ps = s.Text("ps");
  // The flags keep ParseShardAddresses' own message (it names --ps).
  if (ps.empty() && use.needs_shards && !use.as_flags) {
    return absl::InvalidArgumentError("no shards: set \"ps\" (host:port,...) or \"cluster\"");
  }
  if (ps.empty() && !use.needs_shards) return std::vector<std::string>{};
  return ParseShardAddresses(ps);
}

// A model spec (mlp:, cnn:, flat:N, a tensor layout), a preset (cnn-small), or the MLP of
// "hidden", as its canonical spec.
absl::StatusOr<std::string> Model(const SettingReader& s, const SettingsUse& use) {
  if (use.needs_model && s.Text("model").empty() && s.Text("hidden").empty()) {
    return absl::InvalidArgumentError(
        "no model: set \"model\" to the shards' --model (e.g. a layout) or \"cluster\"");
  }
  return ResolveModelSpec(s.Text("model"), s.Text("hidden"));
}

// What tensors travel as: "push_dtype", "pull_dtype", "compress", "pull_compress".
absl::Status ReadEncodings(const SettingReader& s, ClientOptions* options) {
  for (auto [name, option] : {std::pair{"push_dtype", &options->push_type},
                              std::pair{"pull_dtype", &options->pull_type}}) {
    if (const std::string text = s.Text(name); !text.empty()) {
      absl::StatusOr<WireType> type = ParseWireType(text);
      if (!type.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(s.Name(name), ": ", type.status().message()));
      }
      *option = *type;
    }
  }
  for (auto [name, option] : {std::pair{"compress", &options->compression},
                              std::pair{"pull_compress", &options->pull_compression}}) {
    if (const std::string text = s.Text(name); !text.empty()) {
      absl::StatusOr<Compression> compression = ParseCompression(text);
      if (!compression.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(s.Name(name), ": ", compression.status().message()));
      }
      *option = *compression;
    }
  }
  return absl::OkStatus();
}

// Everything of ClientOptions but the credentials, from ClientOptions' own defaults.
absl::StatusOr<ClientOptions> ReadOptions(const SettingReader& s, ClientKind kind) {
  ClientOptions options;
  absl::StatusOr<int> workers = s.Number("num_workers", options.num_workers);
  if (!workers.ok()) return workers.status();
  if (*workers < 0) return absl::InvalidArgumentError(s.Name("num_workers") + " must be >= 0");
  options.num_workers = *workers;
  absl::StatusOr<absl::Duration> timeout =
      s.Seconds("rpc_timeout_seconds", options.rpc_timeout, /*positive=*/true);
  if (!timeout.ok()) return timeout.status();
  options.rpc_timeout = *timeout;
  absl::StatusOr<absl::Duration> retry =
      s.Seconds("retry_seconds", kind == ClientKind::kTool ? absl::Seconds(5) : absl::Seconds(60));
  if (!retry.ok()) return retry.status();
  options.retry_for = *retry;
  const bool first_contact_sooner =
      kind == ClientKind::kInteractive && s.Text("retry_seconds").empty();
  options.connect_for = first_contact_sooner ? absl::Seconds(10) : options.retry_for;
  if (absl::Status e = ReadEncodings(s, &options); !e.ok()) return e;
  for (auto [name, option] : {std::pair{"shared_memory", &options.shared_memory},
                              std::pair{"data_plane", &options.data_plane},
                              std::pair{"error_feedback", &options.error_feedback}}) {
    if (absl::Status b = s.Bool(name, option); !b.ok()) return b;
  }
  return options;
}

}  // namespace

const std::vector<std::string>& ClientSettingNames() {
  static const auto* const kNames = new std::vector<std::string>{"cluster",
                                                                 "compress",
                                                                 "data_plane",
                                                                 "error_feedback",
                                                                 "heartbeat_seconds",
                                                                 "hidden",
                                                                 "model",
                                                                 "num_workers",
                                                                 "ps",
                                                                 "pull_compress",
                                                                 "pull_dtype",
                                                                 "push_dtype",
                                                                 "rank",
                                                                 "retry_seconds",
                                                                 "rpc_timeout_seconds",
                                                                 "shared_memory",
                                                                 "tls_ca",
                                                                 "tls_cert",
                                                                 "tls_key",
                                                                 "token_file"};
  return *kNames;
}

absl::StatusOr<ClientSecurity> ClientSecurityFromSettings(const SettingTexts& settings) {
  const SettingReader s(settings, /*as_flags=*/false);
  return LoadClientSecurity({s.Text("tls_cert"), s.Text("tls_key"), s.Text("tls_ca")},
                            s.Text("token_file"));
}

absl::StatusOr<ClientConnection> ClientConnectionFromSettings(SettingTexts settings,
                                                              const SettingsUse& use) {
  if (absl::Status names = CheckNames(settings); !names.ok()) return names;
  const SettingReader s(settings, use.as_flags);
  ClientConnection c;
  absl::StatusOr<int> rank = s.Number("rank", c.rank);
  if (!rank.ok()) return rank.status();
  c.rank = *rank;
  if (!s.Text("cluster").empty()) {
    if (absl::Status spec = AddClusterSpec(c.rank, &settings); !spec.ok()) return spec;
  }
  absl::StatusOr<std::vector<std::string>> addresses = Shards(s, use);
  if (!addresses.ok()) return addresses.status();
  c.addresses = *std::move(addresses);
  absl::StatusOr<std::string> model = Model(s, use);
  if (!model.ok()) return model.status();
  c.model = *std::move(model);
  absl::StatusOr<ModelIdentity> identity =
      ParseModelSpec(c.model, static_cast<int>(c.addresses.size()));
  if (!identity.ok()) return identity.status();
  c.identity = *std::move(identity);
  absl::StatusOr<ClientOptions> options = ReadOptions(s, use.kind);
  if (!options.ok()) return options.status();
  c.options = *std::move(options);
  absl::StatusOr<absl::Duration> heartbeat = s.Seconds("heartbeat_seconds", c.heartbeat);
  if (!heartbeat.ok()) return heartbeat.status();
  c.heartbeat = *heartbeat;
  absl::StatusOr<ClientSecurity> security = ClientSecurityFromSettings(settings);
  if (!security.ok()) return security.status();
  c.options.security = *std::move(security);
  // A worker's own token (ps --worker_identity) names its rank: refuse another's at once.
  if (std::optional<int> owner = WorkerTokenRank(c.options.security.token);
      c.rank >= 0 && owner.has_value() && *owner != c.rank) {
    return absl::InvalidArgumentError(
        use.as_flags
            ? absl::StrCat("the token (--token_file or PS_TOKEN) is worker ", *owner,
                           "'s own, and this is worker ", c.rank, " (--rank): give it worker ",
                           c.rank, "'s token")
            : absl::StrCat("the token is worker ", *owner, "'s own, not rank ", c.rank, "'s"));
  }
  return c;
}

absl::StatusOr<SettingTexts> SettingsFromJson(absl::string_view json) {
  nlohmann::json root = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError("settings must be a JSON object");
  }
  SettingTexts settings;
  for (const auto& [name, value] : root.items()) {
    if (!value.is_null() && !value.is_string() && !value.is_number() && !value.is_boolean()) {
      return absl::InvalidArgumentError(
          absl::StrCat("setting \"", name, "\" must be a string, number or boolean"));
    }
    settings[name] = value.is_null()     ? ""
                     : value.is_string() ? value.get<std::string>()
                                         : value.dump();
  }
  return settings;
}

}  // namespace ps
