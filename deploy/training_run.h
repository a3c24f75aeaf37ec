// One training run on a local cluster: start S shards, the evaluator and W workers, report
// progress, keep the run going when processes die (a dead worker or evaluator is started again
// and resumes; a dead shard is started again from its checkpoints when there are any), stop at
// the step/time/accuracy limit or on SIGINT/SIGTERM, and collect what the run left behind.
// Shared by the `launch` and `experiment` commands.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "deploy/kill_plan.h"
#include "deploy/local_cluster.h"
#include "proto/ps.pb.h"

namespace ps {

struct TrainingConfig {
  std::string command;  // the command line that asked for the run, for config.txt
  int shards = 2;
  int workers = 4;
  std::string model;  // the model spec every ps is given (ps --model)
  std::string run_dir;
  double max_seconds = 120;    // 0: no limit
  double target_accuracy = 0;  // stop once the evaluator reports this; 0: off
  double progress_seconds = 5;
  std::vector<std::string> ps_flags, worker_flags, evaluator_flags;
  std::map<int, std::vector<std::string>> rank_flags;  // extra flags for one worker (stragglers)
  ClusterSecurity security;                            // TLS and tokens (default: neither)
  std::string progress_prefix;                         // printed before each progress line
  // Every shard writes its checkpoints here (ps --checkpoint_dir). Empty: none, and a shard that
  // dies ends the run, unless it is replicated.
  std::string checkpoint_dir;
  // 2: each shard is a primary and a backup (ps --peer); a replica that dies is started again and
  // joins its peer. Not together with checkpoint_dir (both replicas would write one directory).
  int replicas = 1;
  std::vector<Kill> kills;  // deaths to inject (launch --kill)
  int max_restarts = 3;     // per process; one more death ends the run
  int gpus = 0;             // workers round robin over this many GPUs (LocalCluster::UseGpus)
  // The user's worker and evaluator commands (a Python worker, say) instead of this project's
  // daemons, given their flags in the environment (LocalCluster::StartWorker); "": the daemons.
  std::string worker_command, evaluator_command;
};

// What a job trains, as `launch` and `experiment` describe it: MakeTrainingConfig turns it into
// a TrainingConfig's model and daemon flags, so that both commands start the same daemons alike.
struct JobSpec {
  int shards = 2;
  int workers = 4;
  std::string hidden = "256,128";  // MLP hidden layer sizes
  std::string model;               // a spec or preset (common/network_spec.h) instead; "": hidden
  int batch_size = 64;
  int64_t steps = 0;         // per worker; 0: no limit
  double max_seconds = 120;  // 0: no limit
  uint64_t seed = 1;
  std::string device = "cpu";  // the workers'
  int gpus = 0;                // LocalCluster::UseGpus: one GPU seen per worker, round robin
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  double eval_interval_seconds = 2;
  std::vector<std::string> ps_flags;  // consistency, optimizer, learning rate, ...
  std::string extra_ps_flags;         // space-separated, after ps_flags
  std::vector<std::string> worker_flags;  // e.g. LocalModelFlags, after the ones made here
  std::string extra_worker_flags;         // space-separated, after worker_flags
  std::string straggler;  // RANK:FACTOR (worker RANK computes FACTOR times slower); "": none
  // Commands run instead of the worker and evaluator daemons (TrainingConfig). With a worker
  // command the model may be any spec, a tensor layout included; a model the evaluator daemon
  // cannot build (a layout) needs an evaluator command.
  std::string worker_command, evaluator_command;
};
// The worker flags of a job under `consistency` when its workers train local models (easgd,
// local: the learning rate and momentum are theirs, and decay by cosine over their steps if
// `cosine`); none otherwise.
std::vector<std::string> LocalModelFlags(const std::string& consistency, double lr, double momentum,
                                         bool cosine);
// What launch and experiment take alike from the flags they share (defined with this): shards,
// hidden, batch_size, device, gpus, data_dir, extra_worker_flags (--worker_flags), and the worker and
// evaluator commands (--worker_cmd, --eval_cmd).
void JobFromSharedFlags(JobSpec* job);
// Fails with a one-line reason on bad sizes, a bad straggler, or a model the workers cannot train
// (a layout without a worker command) or no evaluator can score. Leaves run_dir, limits other than
// max_seconds, security, checkpoints and replicas at their defaults.
absl::StatusOr<TrainingConfig> MakeTrainingConfig(const JobSpec& job);

struct TrainingResult {
  std::string failure;  // empty on success: a one-line reason otherwise
  bool interrupted = false;
  double start_unix_seconds = 0;
  double seconds = 0;
  int64_t worker_steps = 0;                    // gradients computed, all workers together
  std::vector<std::string> recoveries;         // one line per process started again
  std::vector<v1::StatsResponse> shard_stats;  // as each shard wrote them at shutdown
};

// Runs the cluster to completion; progress lines go to `progress`. The run directory gets
// config.txt, the CSVs, logs, staleness-shard-S.csv and stats-shard-S.json (replicated:
// -S-R for replica R; shard_stats has the replica that ended furthest on).
// Checks every flag of the config's ps and worker by running each with --dry_run (their own
// parsers, so flags passed through, e.g. --ps_flags, are checked too): OK if the run would start,
// else the daemon's one-line reason. Starts nothing and creates no directory.
absl::Status CheckTrainingConfig(const TrainingConfig& config);
TrainingResult RunTraining(const TrainingConfig& config, std::ostream& progress);

// Field `column` of a CSV line, or NaN.
double CsvField(const std::string& line, int column);

// The accuracy a run of `model` is measured against (its summary's time-to, its plot's line):
// `target` when given (> 0), else `own_networks` for this project's networks, which train
// Fashion-MNIST, else none (0): a tensor layout is the user's model on the user's data.
double ReferenceAccuracy(const std::string& model, double target, double own_networks);

// From an evaluator CSV: the best test accuracy, when it was reached, and when accuracy first
// reached `target` (seconds after `t0`; NaN when it never did, or when `target` is 0: none).
struct AccuracySummary {
  double final_accuracy = NAN, best = NAN, best_at = NAN, target_at = NAN;
};
AccuracySummary SummariseAccuracy(const std::string& evaluator_csv, double t0, double target);

}  // namespace ps
