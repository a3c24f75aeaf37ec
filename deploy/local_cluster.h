// A whole cluster on this machine: S shards on free loopback ports, W workers and an evaluator,
// each a real process with its log and CSV in a run directory. Used by the launcher and by the
// multi-process tests. Not thread-safe.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "deploy/subprocess.h"
#include "proto/ps.grpc.pb.h"

namespace ps {

// TLS and tokens for every daemon of a cluster, as file paths; empty fields are off.
struct ClusterSecurity {
  std::string ca;                       // signed the shards' and the clients' certificates
  std::string server_cert, server_key;  // the shards'; set: TLS
  std::string client_cert, client_key;  // workers' and the evaluator's; set too: mutual TLS
  std::string token_file;               // write token: shards, workers, and the evaluator ...
  std::string read_token_file;          // ... unless this read-only token is set
  // Replicated shards only: the token a shard's replicas prove themselves to each other with.
  // Empty while shards authenticate callers (a token or mutual TLS): StartShards writes a fresh
  // one to run_dir/replication-token.
  std::string replication_token_file;
  // Per-worker identity: the shards get --worker_identity and worker R its own token, written to
  // run_dir/worker-R.token and nothing else (PS_TOKEN is dropped from its environment). The
  // write token comes from token_file, else $PS_TOKEN, else a fresh one; the latter two are
  // written to run_dir/token.
  bool worker_identity = false;

  // Mutual TLS with the files deploy/make_test_certs.sh writes in `dir` (ca.pem, server.pem,
  // server.key, client.pem, client.key); no tokens.
  static ClusterSecurity MutualTls(const std::string& dir);
};

// A port nothing listens on now on 127.0.0.1 (the kernel's pick for a socket bound to port 0),
// for a process that must know its peer's port before that peer starts. Another process may
// take it first: callers that can, retry.
absl::StatusOr<int> FreePort();

class LocalCluster {
 public:
  // Binaries are taken from `bin_dir`; logs and CSVs go to `run_dir` (created with its parents
  // by StartShards). Every daemon started gets the flags that `security` implies.
  LocalCluster(std::string bin_dir, std::string run_dir, ClusterSecurity security = {});

  // Runs a ps and a worker of such a job with --dry_run, as StartShards and StartWorker would
  // start them (shard 0, rank 0, without replication's flags; no worker without
  // `worker_flags`): OK if both would start, else the daemon's one-line reason. Starts nothing
  // and creates no directory.
  absl::Status CheckFlags(int shards, const std::string& model, int num_workers,
                          const std::vector<std::string>& ps_flags,
                          const std::optional<std::vector<std::string>>& worker_flags) const;
  // Stops everything still running (see Stop).
  ~LocalCluster();

  // Starts `count` shards of a job training `model` (a model spec, ps --model) with `num_workers`
  // workers, with --port=0, and waits until each has written the port it bound. With `replicas`
  // = 2, each shard is two processes (ps --peer, ports picked beforehand), replica 0 first.
  absl::Status StartShards(int count, const std::string& model, int num_workers,
                           const std::vector<std::string>& flags, int replicas = 1);
  // Starts shard process `process` (shards()[process]: shard * replicas + replica), which must
  // have exited, again with the same flags on the same port (with --checkpoint_dir among the
  // flags, it resumes from its checkpoint; a replica joins its peer), and waits until it listens.
  absl::Status RestartShard(int process);
  // "127.0.0.1:p0,127.0.0.1:p1,..." (a replicated shard: "127.0.0.1:p/127.0.0.1:q"), for --ps.
  std::string ShardAddresses() const;
  std::string ShardAddress(int shard) const;
  // One process's address: shards()[process].
  std::string ProcessAddress(int process) const;
  // "ps-<shard>" or, replicated, "ps-<shard>-<replica>": its log is run_dir/<name>.log.
  std::string ProcessName(int process) const;
  // (Re)starts worker `rank` of `num_workers`, appending to worker-<rank>.{log,csv}.
  // `command`: a worker command of the user's (e.g. a Python worker) instead of this project's
  // worker, a program and its arguments run as `/bin/sh -c "exec COMMAND"` (sh's quoting; the
  // signals and exit status are the program's own) and told everything through
  // its environment: each --name=value flag the worker would get (--ps, --rank, --num_workers,
  // --csv, credentials, `flags`) becomes PS_NAME=value (PS_PS, PS_RANK, PS_CSV, PS_TOKEN_FILE,
  // PS_STEPS, PS_SLOWDOWN, ...; flags without a value are left out). paramserver.torch reads
  // them (the worker protocol, docs/pytorch.md); this build's Python package leads its PYTHONPATH.
  absl::Status StartWorker(int rank, int num_workers, const std::vector<std::string>& flags,
                           const std::string& command = "");
  // Workers started from now on each see one of `count` GPUs, round robin by rank (worker R the
  // (R mod count)-th): CUDA_VISIBLE_DEVICES names it alone (the entry of this process's
  // CUDA_VISIBLE_DEVICES when that is set, else its index) and LOCAL_RANK=0, so that the worker's
  // cuda:0 is that GPU, as --device=cuda, paramserver.torch.local_device() and a torchrun
  // script's torch.cuda.set_device(LOCAL_RANK) all take it. 0 (the default): the workers get this
  // process's environment as it is. Errors (nothing changed): count < 0, or more GPUs than
  // CUDA_VISIBLE_DEVICES lists.
  absl::Status UseGpus(int count);
  // Likewise for the evaluator (evaluator.{log,csv}; a command gets PS_PS, PS_CSV,
  // PS_INTERVAL_SECONDS, ...).
  absl::Status StartEvaluator(const std::vector<std::string>& flags,
                              const std::string& command = "");

  // GetStats of shard process `process` (shards()[process]) over the cluster's TLS, with its
  // read-only token if it has one (else the write token); the call's error if it does not answer
  // within `deadline` (e.g. the process is down).
  absl::StatusOr<v1::StatsResponse> ProcessStats(int process, absl::Duration deadline);
  // Updates applied so far, summed over shards: each shard's version, the highest any of its
  // replicas answers within `deadline`; a shard none of whose replicas answers counts 0 (so the
  // sum drops while a shard is down, and after one resumes from an older checkpoint).
  int64_t UpdatesApplied(absl::Duration deadline);

  // The worker of that rank, or null if it was never started.
  Subprocess* worker(int rank);
  Subprocess* evaluator() { return evaluator_.get(); }
  std::vector<Subprocess>& shards() { return shards_; }
  const std::string& run_dir() const { return run_dir_; }

  // Stops workers, then the evaluator (which scores the final weights), then the shards, each with
  // SIGTERM and a grace period (15 s; the evaluator's 120 s: scoring a CNN takes a while). Returns
  // "" or a description of processes that exited badly.
  std::string Stop();

 private:
  // Append the security flags of a shard, and of a client sending the token in `token_file`.
  void AppendShardSecurityFlags(std::vector<std::string>* argv) const;
  void AppendClientSecurityFlags(const std::string& token_file,
                                 std::vector<std::string>* argv) const;
  // Replicated shards that authenticate callers need a replication token: writes a fresh one
  // to run_dir/replication-token unless security_ names one.
  absl::Status EnsureReplicationToken();
  // With worker_identity and no token_file: writes $PS_TOKEN, else a fresh token, to
  // run_dir/token and names it token_file.
  absl::Status EnsureJobToken();
  // Writes worker `rank`'s own token to run_dir/worker-<rank>.token; returns the path.
  absl::StatusOr<std::string> WorkerTokenFile(int rank);

  absl::Status MakeRunDir() const;
  // Starts `argv` (a daemon of bin_dir_ and its flags) or, when `command` is set, that command
  // with the flags in its environment (see StartWorker), logging to `log`; `env` is added to the
  // environment of either.
  absl::StatusOr<Subprocess> StartClient(const std::vector<std::string>& argv,
                                         const std::string& command, const std::string& log,
                                         const std::vector<std::string>& drop_env,
                                         std::map<std::string, std::string> env = {}) const;
  std::string PortFile(int shard) const;
  // Starts shard `shard` from shard_argv_ (replacing shards_[shard]) / waits until it wrote its
  // port file, then records the port.
  absl::Status LaunchShard(int shard);
  absl::Status AwaitPort(int shard);

  std::string bin_dir_, run_dir_;
  ClusterSecurity security_;
  int replicas_ = 1;
  std::vector<std::vector<std::string>> shard_argv_;  // by process
  std::vector<Subprocess> shards_;
  std::vector<int> ports_;
  // One stub per shard process, made on first use (ProcessStats); cleared with the shards.
  std::vector<std::unique_ptr<v1::ParameterServer::Stub>> stubs_;
  std::string token_;  // what ProcessStats sends
  std::map<int, Subprocess> workers_;
  std::vector<std::string> gpus_;  // UseGpus: CUDA_VISIBLE_DEVICES of worker R is gpus_[R % size]
  std::unique_ptr<Subprocess> evaluator_;
};


}  // namespace ps
