#include "common/cluster_spec.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/cluster.h"
#include "common/flags_help.h"
#include "common/model_spec.h"
#include "common/network_spec.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, cluster, "",
          "Cluster spec (JSON) describing the whole job; this daemon's part is --role (or "
          "$PS_ROLE). Flags on the command line override the file.");
ABSL_FLAG(std::string, role, "",
          "With --cluster: ps:S (ps:S/R for replica R), worker:R or evaluator (else $PS_ROLE).");

namespace ps {
namespace {

// The canonical spec of the job's model.
std::string ModelOf(const ClusterSpec& spec) {
  return spec.model.empty() ? MlpSpec(*MlpLayerSizes(784, spec.hidden, 10)) : spec.model;
}

using Json = nlohmann::json;

absl::Status Bad(const std::string& what) {
  return absl::InvalidArgumentError("cluster spec: " + what);
}

// A flag value from a JSON scalar; fails for objects, arrays and null.
absl::StatusOr<std::string> ScalarText(const Json& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return std::string(v.get<bool>() ? "true" : "false");
  if (v.is_number_integer()) return v.dump();
  if (v.is_number_float()) return v.dump();
  return Bad(absl::StrCat(where, " must be a string, number or boolean"));
}

// "host:port" -> {host, port}.
std::pair<std::string, std::string> HostPort(const std::string& address) {
  size_t colon = address.rfind(':');
  return {address.substr(0, colon), address.substr(colon + 1)};
}

// "shards_per_host": k: the entries (one per host, checked), then each with every port one higher,
// and so on, k times in all; shard i is then on entry i % entries.size()'s hosts. Fails naming an
// entry whose ports would pass 65535, or two shards that would share an address.
absl::StatusOr<std::vector<std::string>> SpreadOverHosts(const std::vector<std::string>& entries,
                                                         int k) {
  std::vector<std::string> spread;
  std::map<std::string, size_t> taken;  // address -> the shard that has it
  for (int round = 0; round < k; ++round) {
    for (const std::string& entry : entries) {
      std::vector<std::string> replicas;
      for (const std::string& replica : ShardReplicas(entry)) {
        auto [host, port] = HostPort(replica);
        int number = 0;
        if (!absl::SimpleAtoi(port, &number) || number + k - 1 > 65535) {
          return absl::InvalidArgumentError(
              absl::StrCat("shard entry \"", entry, "\": with \"shards_per_host\": ", k,
                           " its ports run to ", port, " + ", k - 1, ", past 65535"));
        }
        replicas.push_back(absl::StrCat(host, ":", number + round));
        auto [it, fresh] = taken.try_emplace(replicas.back(), spread.size());
        if (!fresh) {
          return absl::InvalidArgumentError(
              absl::StrCat("with \"shards_per_host\": ", k, ", shards ", it->second, " and ",
                           spread.size(), " would both be at ", replicas.back()));
        }
      }
      spread.push_back(absl::StrJoin(replicas, "/"));
    }
  }
  return spread;
}

// Flags naming files a daemon reads, which travel with the spec: resolved against its directory.
bool IsInputPathFlag(const std::string& name) {
  static const auto* const kInputs = new std::set<std::string>{
      "tls_cert", "tls_key", "tls_ca", "token_file", "read_token_file", "replication_token_file",
      "data_dir"};
  return kInputs->count(name) > 0;
}

// Flags naming a file a worker writes: each worker needs its own ({rank}).
bool IsWorkerOutputFlag(const std::string& name) {
  return name == "csv" || absl::EndsWith(name, "_csv") || absl::EndsWith(name, "_json");
}

// `replicated`: the role is a replica of a replicated shard (ps --peer); `rank`: a worker's.
void AddSecurity(const ClusterSpec& spec, const std::string& program, bool replicated, int rank,
                 std::vector<std::string>* flags) {
  auto get = [&](const char* key) {
    auto it = spec.security.find(key);
    return it == spec.security.end() ? std::string() : it->second;
  };
  auto add = [&](const char* flag, const std::string& value) {
    if (!value.empty()) flags->push_back(absl::StrCat("--", flag, "=", value));
  };
  if (program == "ps") {
    add("tls_cert", get("server_cert"));
    add("tls_key", get("server_key"));
    if (!get("client_cert").empty()) add("tls_ca", get("ca"));  // clients present certificates
    add("token_file", get("token_file"));
    add("read_token_file", get("read_token_file"));
    if (replicated) add("replication_token_file", get("replication_token_file"));
    if (!get("worker_token_file").empty()) flags->push_back("--worker_identity=true");
    return;
  }
  add("tls_ca", get("ca"));
  add("tls_cert", get("client_cert"));
  add("tls_key", get("client_key"));
  const std::string read_token = get("read_token_file");
  const bool reads_only = program != "worker";             // the evaluator and the tools
  if (!reads_only && !get("worker_token_file").empty()) {  // the worker's own token
    add("token_file",
        absl::StrReplaceAll(get("worker_token_file"), {{"{rank}", absl::StrCat(rank)}}));
    return;
  }
  add("token_file", reads_only && !read_token.empty() ? read_token : get("token_file"));
}

absl::Status CheckTopLevelKeys(const Json& root) {
  static const std::set<std::string> kKeys = {"hidden",          "model",     "shards",
                                              "shards_per_host", "workers",   "ps",
                                              "worker",          "evaluator", "security"};
  for (const auto& [key, value] : root.items()) {
    if (kKeys.count(key) == 0) {
      return Bad(
          absl::StrCat("unknown key \"", key, "\" (expected ", absl::StrJoin(kKeys, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

// "hidden": "256,128" or [256, 128], checked as the MLP's sizes.
absl::Status ParseHidden(const Json& root, ClusterSpec* spec) {
  if (!root.contains("hidden")) return absl::OkStatus();
  const Json& h = root["hidden"];
  if (h.is_string()) {
    spec->hidden = h.get<std::string>();
  } else if (h.is_array()) {
    std::vector<std::string> sizes;
    for (const Json& n : h) {
      if (!n.is_number_integer()) return Bad("\"hidden\" must hold integers");
      sizes.push_back(n.dump());
    }
    spec->hidden = absl::StrJoin(sizes, ",");
  } else {
    return Bad("\"hidden\" must be a string like \"256,128\" or an array of sizes");
  }
  if (absl::Status s = MlpLayerSizes(784, spec->hidden, 10).status(); !s.ok()) {
    return Bad("\"hidden\": " + std::string(s.message()));
  }
  return absl::OkStatus();
}

// "model": a spec, preset, layout file (relative to `dir`) or layout object, made canonical.
absl::Status ParseModel(const Json& root, const std::string& dir, ClusterSpec* spec) {
  if (!root.contains("model")) return absl::OkStatus();
  if (root.contains("hidden")) return Bad("give \"model\" or \"hidden\", not both");
  const Json& m = root["model"];
  if (!m.is_string() && !m.is_object()) {
    return Bad(
        "\"model\" must be a spec or preset string (common/network_spec.h), a layout "
        "file name (F.json) or a layout object (common/tensor_layout.h)");
  }
  std::string model = m.is_object() ? m.dump() : m.get<std::string>();
  if (m.is_string() && IsLayoutSpec(model) && !IsInlineLayout(model) && !dir.empty() &&
      model.front() != '/') {
    model = dir + "/" + model;  // a layout file beside the spec
  }
  absl::StatusOr<std::string> canonical = ResolveModelSpec(model, "");
  if (!canonical.ok()) return Bad("\"model\": " + std::string(canonical.status().message()));
  spec->model = *std::move(canonical);
  return absl::OkStatus();
}

// "shards", spread over the hosts when "shards_per_host" says so.
absl::Status ParseShards(const Json& root, ClusterSpec* spec) {
  if (!root.contains("shards") || !root["shards"].is_array() || root["shards"].empty()) {
    return Bad("\"shards\" must be a non-empty array of \"host:port\" (or \"a:port/b:port\")");
  }
  std::vector<std::string> entries;
  for (const Json& s : root["shards"]) {
    if (!s.is_string()) return Bad("every entry of \"shards\" must be a string");
    entries.push_back(s.get<std::string>());
    if (entries.back().empty() || entries.back().find(',') != std::string::npos) {
      return Bad(absl::StrCat("shard entry \"", entries.back(),
                              "\" must be one \"host:port\" or \"host:port/host:port\""));
    }
  }
  absl::StatusOr<std::vector<std::string>> shards =
      ParseShardAddresses(absl::StrJoin(entries, ","));
  if (!shards.ok()) return Bad("\"shards\": " + std::string(shards.status().message()));
  spec->shards = *std::move(shards);
  if (!root.contains("shards_per_host")) return absl::OkStatus();
  const Json& k = root["shards_per_host"];
  if (!k.is_number_integer() || k.get<int64_t>() < 1 || k.get<int64_t>() > 64) {
    return Bad("\"shards_per_host\" must be an integer from 1 to 64");
  }
  absl::StatusOr<std::vector<std::string>> spread = SpreadOverHosts(spec->shards, k.get<int>());
  if (!spread.ok()) return Bad(std::string(spread.status().message()));
  spec->shards = *std::move(spread);
  return absl::OkStatus();
}

// The "ps", "worker" and "evaluator" sections: scalar flags, none the spec derives itself.
absl::Status ParseRoleSections(const Json& root, ClusterSpec* spec) {
  static const std::map<std::string, std::set<std::string>> kDerived = {
      {"ps", {"shard_index", "num_shards", "num_workers", "model", "port", "peer", "replica"}},
      {"worker", {"ps", "rank", "num_workers", "hidden", "model"}},
      {"evaluator", {"ps", "hidden", "model"}}};
  for (const char* role : {"ps", "worker", "evaluator"}) {
    if (!root.contains(role)) continue;
    if (!root[role].is_object()) return Bad(absl::StrCat("\"", role, "\" must be an object"));
    for (const auto& [name, value] : root[role].items()) {
      if (kDerived.at(role).count(name) > 0) {
        return Bad(absl::StrCat(role, ".", name,
                                " comes from the spec itself (shards, workers, model, the role)"));
      }
      absl::StatusOr<std::string> text = ScalarText(value, absl::StrCat(role, ".", name));
      if (!text.ok()) return text.status();
      spec->role_flags[role][name] = *text;
    }
  }
  return absl::OkStatus();
}

absl::Status ParseSecurity(const Json& root, ClusterSpec* spec) {
  if (!root.contains("security")) return absl::OkStatus();
  static const std::set<std::string> kSecurity = {"ca",
                                                  "server_cert",
                                                  "server_key",
                                                  "client_cert",
                                                  "client_key",
                                                  "token_file",
                                                  "read_token_file",
                                                  "replication_token_file",
                                                  "worker_token_file"};
  if (!root["security"].is_object()) return Bad("\"security\" must be an object");
  for (const auto& [name, value] : root["security"].items()) {
    if (kSecurity.count(name) == 0) {
      return Bad(absl::StrCat("unknown security key \"", name, "\" (expected ",
                              absl::StrJoin(kSecurity, ", "), ")"));
    }
    if (!value.is_string()) return Bad(absl::StrCat("security.", name, " must be a path"));
    spec->security[name] = value.get<std::string>();
  }
  return absl::OkStatus();
}

// A file the workers write is one per worker ({rank}) when there are several.
absl::Status CheckWorkerOutputs(const ClusterSpec& spec) {
  auto worker = spec.role_flags.find("worker");
  if (worker == spec.role_flags.end()) return absl::OkStatus();
  for (const auto& [name, value] : worker->second) {
    if (IsWorkerOutputFlag(name) && spec.workers > 1 && value.find("{rank}") == std::string::npos) {
      return Bad(absl::StrCat("worker.", name, " \"", value, "\" would be one file for all ",
                              spec.workers, " workers: put {rank} in it (e.g. \"worker-{rank}.",
                              name == "csv" ? "csv" : "json", "\")"));
    }
  }
  return absl::OkStatus();
}

// What the security files need of each other and of replicated shards.
absl::Status CheckSecurity(const ClusterSpec& spec) {
  if (auto it = spec.security.find("worker_token_file"); it != spec.security.end()) {
    if (it->second.find("{rank}") == std::string::npos) {
      return Bad(
          "security.worker_token_file must contain {rank} (each worker's own token, e.g. "
          "\"tokens/worker-{rank}\")");
    }
    if (spec.security.count("token_file") == 0) {
      return Bad(
          "security.worker_token_file needs security.token_file (the job's write token, which "
          "the shards make workers' tokens from)");
    }
  }
  // A backup connects to its primary as a client: over TLS it needs a client certificate.
  const bool replicated = std::any_of(spec.shards.begin(), spec.shards.end(), [](const auto& e) {
    return e.find('/') != std::string::npos;
  });
  if (replicated && spec.security.count("server_cert") > 0 &&
      spec.security.count("client_cert") == 0) {
    return Bad(
        "replicated shards over TLS need security.client_cert and client_key (a backup "
        "connects to its primary with them)");
  }
  // The job's tokens cannot replicate (a worker must not fence a shard's replicas).
  const bool authenticated =
      spec.security.count("token_file") > 0 ||
      (spec.security.count("server_cert") > 0 && spec.security.count("client_cert") > 0);
  if (replicated && authenticated && spec.security.count("replication_token_file") == 0) {
    return Bad(
        "replicated shards with a token or mutual TLS need security.replication_token_file (the "
        "token the replicas of a shard prove themselves to each other with)");
  }
  return absl::OkStatus();
}

// The clients get the model as the spec gave it: --model, or the MLP's --hidden sizes.
std::string ClientModelFlag(const ClusterSpec& spec) {
  return spec.model.empty() ? "--hidden=" + spec.hidden : "--model=" + spec.model;
}

// The flags of "ps:S" or "ps:S/R" (replica R of shard S); *replicated when the shard has two
// replicas. Fails naming a shard or replica the spec does not have.
absl::StatusOr<std::vector<std::string>> ShardRoleFlags(const ClusterSpec& spec,
                                                        const std::string& role, bool* replicated) {
  const size_t colon = role.find(':');
  const int shards = static_cast<int>(spec.shards.size());
  std::string index_text = colon == std::string::npos ? "" : role.substr(colon + 1);
  int replica = -1;
  if (size_t slash = index_text.find('/'); slash != std::string::npos) {
    if (!absl::SimpleAtoi(index_text.substr(slash + 1), &replica) || replica < 0 || replica > 1) {
      return absl::InvalidArgumentError("role '" + role + "': the replica must be 0 or 1");
    }
    index_text = index_text.substr(0, slash);
  }
  int shard = -1;
  if (!absl::SimpleAtoi(index_text, &shard) || shard < 0 || shard >= shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("role '", role, "': the spec has shards 0..", shards - 1));
  }
  std::vector<std::string> replicas = ShardReplicas(spec.shards[shard]);
  if (replicas.size() == 2 && replica < 0) {
    return absl::InvalidArgumentError(absl::StrCat("role '", role, "': shard ", shard,
                                                   " is replicated: give ps:", shard,
                                                   "/0 or ps:", shard, "/1"));
  }
  if (replicas.size() == 1 && replica > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("role '", role, "': shard ", shard, " has one replica"));
  }
  const int r = std::max(replica, 0);
  auto [host, port] = HostPort(replicas[r]);
  std::vector<std::string> flags = {absl::StrCat("--shard_index=", shard),
                                    absl::StrCat("--num_shards=", shards),
                                    absl::StrCat("--num_workers=", spec.workers),
                                    "--model=" + ModelOf(spec),
                                    "--host=" + host,
                                    "--port=" + port};
  *replicated = replicas.size() == 2;
  if (*replicated) {
    flags.push_back("--peer=" + replicas[1 - r]);
    flags.push_back(absl::StrCat("--replica=", r));
  }
  return flags;
}

// The flags of "worker:R", R in *rank. Fails naming a worker the spec does not have.
absl::StatusOr<std::vector<std::string>> WorkerRoleFlags(const ClusterSpec& spec,
                                                         const std::string& role, int* rank) {
  const size_t colon = role.find(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(role.substr(colon + 1), rank) || *rank < 0 ||
      *rank >= spec.workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("role '", role, "': the spec has workers 0..", spec.workers - 1));
  }
  return std::vector<std::string>{
      "--ps=" + absl::StrJoin(spec.shards, ","), absl::StrCat("--rank=", *rank),
      absl::StrCat("--num_workers=", spec.workers), ClientModelFlag(spec)};
}

// Scans argv for --name=VALUE or --name VALUE (also with one dash); "" if absent.
std::string ArgValue(int argc, char** argv, const std::string& name) {
  std::string value;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") break;
    for (const std::string& prefix : {"--" + name, "-" + name}) {
      if (arg.rfind(prefix + "=", 0) == 0) value = arg.substr(prefix.size() + 1);
      if (arg == prefix && i + 1 < argc) value = argv[++i];
    }
  }
  return value;
}

}  // namespace

absl::StatusOr<ClusterSpec> ParseClusterSpec(const std::string& text, const std::string& dir) {
  Json root = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Bad("not valid JSON");
  if (!root.is_object()) return Bad("the top level must be an object");
  ClusterSpec spec;
  if (absl::Status s = CheckTopLevelKeys(root); !s.ok()) return s;
  if (absl::Status s = ParseHidden(root, &spec); !s.ok()) return s;
  if (absl::Status s = ParseModel(root, dir, &spec); !s.ok()) return s;
  if (absl::Status s = ParseShards(root, &spec); !s.ok()) return s;
  if (!root.contains("workers") || !root["workers"].is_number_integer() ||
      root["workers"].get<int64_t>() < 1 || root["workers"].get<int64_t>() > 1000000) {
    return Bad("\"workers\" must be a positive integer");
  }
  spec.workers = root["workers"].get<int>();
  if (absl::Status s = ParseRoleSections(root, &spec); !s.ok()) return s;
  if (absl::Status s = ParseSecurity(root, &spec); !s.ok()) return s;
  if (absl::Status s = CheckWorkerOutputs(spec); !s.ok()) return s;
  if (absl::Status s = CheckSecurity(spec); !s.ok()) return s;
  return spec;
}

absl::StatusOr<ClusterSpec> ReadClusterSpec(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("cannot read the cluster spec " + path);
  std::stringstream text;
  text << in.rdbuf();
  // Relative paths of files the daemons read name files beside the spec, wherever a daemon runs
  // from (what they write stays relative to their working directory).
  const std::string dir = std::filesystem::path(path).parent_path().string();
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(text.str(), dir);
  if (!spec.ok())
    return absl::Status(spec.status().code(), path + ": " + std::string(spec.status().message()));
  auto resolve = [&](std::string& value) {
    if (!dir.empty() && !value.empty() && value.front() != '/') value = dir + "/" + value;
  };
  for (auto& [key, value] : spec->security) resolve(value);
  for (auto& [role, flags] : spec->role_flags) {
    for (auto& [name, value] : flags) {
      if (IsInputPathFlag(name)) resolve(value);
    }
  }
  return spec;
}

absl::StatusOr<std::string> DescribeRoles(const ClusterSpec& spec) {
  std::vector<std::pair<std::string, std::string>> roles;  // (program, role)
  for (size_t i = 0; i < spec.shards.size(); ++i) {
    const size_t replicas = ShardReplicas(spec.shards[i]).size();
    for (size_t r = 0; r < replicas; ++r) {
      roles.push_back(
          {"ps", replicas == 1 ? absl::StrCat("ps:", i) : absl::StrCat("ps:", i, "/", r)});
    }
  }
  for (int w = 0; w < spec.workers; ++w) roles.push_back({"worker", absl::StrCat("worker:", w)});
  roles.push_back({"evaluator", "evaluator"});
  std::string out;
  for (const auto& [program, role] : roles) {
    absl::StatusOr<std::vector<std::string>> flags = FlagsForRole(spec, program, role);
    if (!flags.ok()) return flags.status();
    absl::StrAppend(&out, role, " ", absl::StrJoin(*flags, " "), "\n");
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> FlagsForRole(const ClusterSpec& spec,
                                                      const std::string& program,
                                                      const std::string& role) {
  const size_t colon = role.find(':');
  const std::string kind = role.substr(0, colon);
  if (kind != program) {
    return absl::InvalidArgumentError(
        absl::StrCat("role '", role, "' is not one of ", program, "'s (expected ",
                     program == "ps" || program == "worker" ? program + ":N" : program, ")"));
  }
  absl::StatusOr<std::vector<std::string>> flags;
  bool replicated = false;  // a replica of a replicated shard (ps --peer)
  int worker_rank = -1;
  if (program == "ps") {
    flags = ShardRoleFlags(spec, role, &replicated);
  } else if (program == "worker") {
    flags = WorkerRoleFlags(spec, role, &worker_rank);
  } else if (program == "evaluator" || program == "export_model" || program == "psctl") {
    if (role != program) {
      return absl::InvalidArgumentError("role '" + role + "': expected " + program);
    }
    flags =
        std::vector<std::string>{"--ps=" + absl::StrJoin(spec.shards, ","), ClientModelFlag(spec)};
  } else {
    return absl::InvalidArgumentError("no cluster-spec role for program " + program);
  }
  if (!flags.ok()) return flags.status();
  AddSecurity(spec, program, replicated, worker_rank, &*flags);
  if (auto it = spec.role_flags.find(program); it != spec.role_flags.end()) {
    for (const auto& [name, value] : it->second) {
      flags->push_back(absl::StrCat(
          "--", name, "=",
          absl::StrReplaceAll(value, {{"{rank}", absl::StrCat(std::max(worker_rank, 0))}})));
    }
  }
  return flags;
}

absl::StatusOr<ClusterArgs> ExpandClusterArgs(int argc, char** argv, const std::string& program) {
  ClusterArgs out;
  out.args.assign(argv, argv + argc);
  const std::string path = ArgValue(argc, argv, "cluster");
  if (path.empty()) return out;
  std::string role = ArgValue(argc, argv, "role");
  // $PS_ROLE names a job's ps or worker process; the evaluator (one per job) and the tools need
  // no role, and ignore it (they may run inside a worker's pod).
  const bool has_role = program == "ps" || program == "worker";
  if (role.empty() && has_role && std::getenv("PS_ROLE") != nullptr) role = std::getenv("PS_ROLE");
  if (role.empty() && !has_role) role = program;
  if (role.empty()) {
    return absl::InvalidArgumentError(
        "--cluster needs this daemon's role: --role=... or $PS_ROLE (ps:S, worker:R, evaluator)");
  }
  absl::StatusOr<ClusterSpec> spec = ReadClusterSpec(path);
  if (!spec.ok()) return spec.status();
  absl::StatusOr<std::vector<std::string>> flags = FlagsForRole(*spec, program, role);
  if (!flags.ok()) return flags.status();
  out.spec_path = path;
  if (auto section = spec->role_flags.find(program); section != spec->role_flags.end()) {
    for (const auto& [name, value] : section->second) out.section_keys.push_back(name);
  }
  out.args.insert(out.args.begin() + 1, flags->begin(), flags->end());
  // A layout's inline JSON would fill the log line: its fingerprint names it.
  std::string model = ModelOf(*spec);
  if (absl::StatusOr<ModelIdentity> id = ParseModelSpec(model, 1); id.ok() && IsLayoutSpec(model)) {
    model = id->fingerprint;
  }
  std::vector<std::string> shown = *flags;
  for (std::string& flag : shown) {
    if (absl::StartsWith(flag, "--model=")) flag = "--model=" + model;
  }
  out.summary =
      absl::StrCat(role, " of ", path, " (", spec->shards.size(), " shard(s), ", spec->workers,
                   " worker(s), ", model, "): ", absl::StrJoin(shown, " "));
  return out;
}

absl::StatusOr<ParsedCommandLine> ParseDaemonFlags(int argc, char** argv,
                                                   const std::string& program,
                                                   const std::string& usage) {
  absl::StatusOr<ClusterArgs> expanded = ExpandClusterArgs(argc, argv, program);
  if (!expanded.ok()) return expanded.status();
  // A misspelt key in the spec's section is named as the spec's, not as an unknown flag.
  for (const std::string& name : expanded->section_keys) {
    if (!HasFlag(program, name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cluster spec ", expanded->spec_path, ": the \"", program, "\" section sets \"", name,
          "\", which is not a ", program, " flag (see ", program, " --help)"));
    }
  }
  std::vector<char*> args = expanded->argv();
  std::vector<char*> rest =
      ParseFlagsOrHelp(static_cast<int>(args.size()), args.data(), program, usage);
  ParsedCommandLine parsed;
  parsed.spec_summary = expanded->summary;
  parsed.positional.assign(rest.begin() + 1, rest.end());
  return parsed;
}

}  // namespace ps
