// The cluster spec: one JSON file describing a whole job, which every daemon reads with
// --cluster=FILE (in the spirit of TF_CONFIG). A daemon's own part comes from --role or $PS_ROLE
// ("ps:S", "ps:S/R" for replica R of a replicated shard, "worker:R", "evaluator"), so one file
// serves a whole Kubernetes or Slurm job. The spec becomes flags placed before the command line's
// own, so any flag given on the command line overrides the file.
//
//   {
//     "hidden": "256,128",                     MLP hidden sizes (the model: mlp:784-...-10), or
//     "model": "cnn-small",                    a model spec or preset (common/network_spec.h), a
//                                              tensor layout file "F.json" or object {"tensors":
//                                              [...]} (common/tensor_layout.h)
//     "shards": ["h1:50051", "h2:50051/h3:50051"],   in shard order; "a/b": two replicas
//     "shards_per_host": 4,                    optional: each entry's host runs 4 shards, on its
//                                              port and the next 3, listed host by host in turn
//                                              (h1:50051, h2:50051/h3:50051, h1:50052, ...): the
//                                              flat vector's parts spread over the hosts
//     "workers": 4,
//     "ps": {"consistency": "async", "optimizer": "momentum", "lr": 0.01},   flags of every ps
//     "worker": {"batch_size": 64, "device": "auto"},                         of every worker
//     "evaluator": {"interval_seconds": 2},
//     "security": {"ca": "ca.pem", "server_cert": "server.pem", "server_key": "server.key",
//                  "client_cert": "client.pem", "client_key": "client.key",
//                  "token_file": "token", "read_token_file": "read-token",
//                  "replication_token_file": "replication-token",   replicated shards only
//                  "worker_token_file": "tokens/worker-{rank}"}     per-worker identity
//   }
//
// Every field but "shards" and "workers" is optional; values of the per-role sections are
// strings, numbers or booleans, passed as --name=value (an unknown name fails like a bad flag).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ps {

struct ClusterSpec {
  std::string hidden = "256,128";
  std::string model;  // canonical spec from "model" (a layout inline); empty: the MLP of `hidden`
  std::vector<std::string> shards;  // entries as ParseShardAddresses gives them
  int workers = 0;
  // Per-role flags, by role kind ("ps", "worker", "evaluator"): name -> value.
  std::map<std::string, std::map<std::string, std::string>> role_flags;
  // "security": ca, server_cert, server_key, client_cert, client_key, token_file, read_token_file,
  // replication_token_file (given to replicated shards only; required for them with a token or
  // mutual TLS), worker_token_file (with "{rank}": worker R gets its own token from that file
  // instead of token_file, and the shards --worker_identity).
  std::map<std::string, std::string> security;
};

// Parses the JSON text; fails naming the first problem (bad JSON, a missing or mistyped field, a
// bad shard address, an unknown key). A relative layout file name in "model" is read from `dir`
// (ReadClusterSpec: the spec's directory).
absl::StatusOr<ClusterSpec> ParseClusterSpec(const std::string& json, const std::string& dir = "");
absl::StatusOr<ClusterSpec> ReadClusterSpec(const std::string& path);

// The flags that `role` of `program` ("ps", "worker", "evaluator"; or the tools "export_model" and
// "psctl", which get the evaluator's connection flags and no section of their own) gets from the
// spec. Fails
// when the role is malformed, is not one of `program`'s, or names a shard, replica or worker that
// the spec does not have.
absl::StatusOr<std::vector<std::string>> FlagsForRole(const ClusterSpec& spec,
                                                      const std::string& program,
                                                      const std::string& role);

// Every role the spec describes, a line each with the flags it gets: "ps:0 --shard_index=0 ...",
// ("ps:S/R" for the replicas of a replicated shard), "worker:R ...", "evaluator ...". Fails like
// FlagsForRole (psctl spec prints it, so a spec can be checked before any daemon starts).
absl::StatusOr<std::string> DescribeRoles(const ClusterSpec& spec);

// The command line `program` should parse: argv[0], the spec's flags for its role, then the rest of
// argv unchanged (so they win). Without --cluster (as --cluster=FILE or --cluster FILE) argv comes
// back as it is. The role comes from --role, else $PS_ROLE. Also returns, for the start-up log, a
// line saying what the spec made this daemon.
struct ClusterArgs {
  std::vector<std::string> args;
  std::string summary;  // "" without --cluster
  std::string spec_path;                  // --cluster
  std::vector<std::string> section_keys;  // the names the spec's section for the program sets
  // args as argv for absl::ParseCommandLine; valid while this object lives unchanged.
  std::vector<char*> argv() {
    std::vector<char*> v;
    for (std::string& a : args) v.push_back(a.data());
    return v;
  }
};
absl::StatusOr<ClusterArgs> ExpandClusterArgs(int argc, char** argv, const std::string& program);

// A daemon's whole command-line parse: puts the cluster spec's flags for its role first
// (ExpandClusterArgs), refuses a key of the spec's section that is not one of the program's flags
// (naming the spec), then parses (common/flags_help.h: --help prints `usage` and the program's
// own flags). Fails with a one-line reason.
struct ParsedCommandLine {
  std::string spec_summary;             // the line to log about the spec; "" without --cluster
  std::vector<std::string> positional;  // the arguments that are not flags (argv[0] excluded)
};
absl::StatusOr<ParsedCommandLine> ParseDaemonFlags(int argc, char** argv,
                                                   const std::string& program,
                                                   const std::string& usage);

}  // namespace ps
