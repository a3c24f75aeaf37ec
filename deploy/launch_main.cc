// launch: runs a whole cluster on this machine (S shards + W workers + the evaluator on 127.0.0.1
// with free ports), shows progress, stops everything cleanly at the end or on Ctrl-C, and leaves a
// run directory with the configuration, CSVs, logs and a plot.
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "absl/algorithm/container.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/flags_help.h"
#include "common/log.h"
#include "common/model_spec.h"
#include "common/shutdown.h"
#include "deploy/training_run.h"

ABSL_FLAG(int, workers, 4, "Workers.");
ABSL_FLAG(std::string, run_dir, "", "Run directory (default runs/<date-time>).");
ABSL_FLAG(double, max_seconds, 600, "Stop training after this many seconds; 0: no limit.");
ABSL_FLAG(int64_t, steps, 6000, "Steps per worker; 0: no limit (then --max_seconds ends the run).");
ABSL_FLAG(double, target_accuracy, 0,
          "Stop once the evaluator reports this test accuracy, and report the time to it; 0: "
          "run on, measured against Fashion-MNIST's published MLP baseline (0.8833) for this "
          "project's networks and against nothing for a tensor layout (your own model).");
ABSL_FLAG(std::string, consistency, "async",
          "async | sync | ssp:S | easgd:T[,A] | local:H (see ps --help). Under easgd and local "
          "the workers train their own models with --lr, --momentum and the schedule.");
ABSL_FLAG(int, backup_workers, 0, "sync, local: rounds close after (workers - this) pushes.");
ABSL_FLAG(std::string, optimizer, "momentum",
          "Server optimizer: sgd|momentum|nesterov|adam|adagrad.");
ABSL_FLAG(double, lr, 0.01, "Learning rate.");
ABSL_FLAG(std::string, lr_schedule, "auto",
          "auto: cosine to 0 over the run's updates when --steps bounds the run (so it ends at its "
          "best), else constant | constant | cosine (needs --steps) | step (ps --lr_step_updates "
          "and --lr_gamma through --ps_flags).");
ABSL_FLAG(double, momentum, 0.9, "Momentum coefficient.");
ABSL_FLAG(std::string, model, "",
          "The model instead of the --hidden MLP: a spec (cnn:1x28x28-conv32k5-pool2-fc128-10, "
          "grammar in common/network_spec.h), a preset (cnn-small, cnn-large), or with "
          "--worker_cmd a tensor layout (F.json, common/tensor_layout.h).");
ABSL_FLAG(uint64_t, seed, 1, "Seed of initial weights and batch order.");
ABSL_FLAG(std::string, straggler, "", "RANK:FACTOR makes worker RANK compute FACTOR times slower.");
ABSL_FLAG(std::string, ps_flags, "", "More flags for every ps, e.g. \"--lr_schedule=cosine\".");
ABSL_FLAG(double, eval_interval_seconds, 2, "Seconds between evaluations.");
ABSL_FLAG(double, progress_seconds, 5, "Seconds between progress lines.");
ABSL_FLAG(std::string, tls_dir, "",
          "Run the cluster over mutual TLS with the files deploy/make_test_certs.sh writes here "
          "(ca.pem, server.pem, server.key, client.pem, client.key).");
ABSL_FLAG(std::string, token_file, "",
          "File holding the write token for shards and workers (else $PS_TOKEN, which the daemons "
          "read themselves).");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Shards write checkpoints here and a shard that dies is started again from them "
          "(default: <run_dir>/checkpoints; none: off, and a dead shard ends the run).");
ABSL_FLAG(double, checkpoint_seconds, 10, "Seconds between checkpoints of each shard.");
ABSL_FLAG(int, replicas, 1,
          "2: each shard runs as a primary and a backup (ps --peer); pushes are acknowledged once "
          "both applied them, and a replica that dies is started again and joins its peer. "
          "Replaces checkpoints (off by default then); async and ssp:S only.");
ABSL_FLAG(std::string, kill, "",
          "Deaths to inject (SIGKILL), each once its trigger is reached: worker:2@300steps (the "
          "workers' steps, summed), ps:1@800u (updates applied, summed over shards) or "
          "worker:0@20s (seconds after the start; progress triggers hit the same point of a run "
          "on any machine). With --replicas=2, ps:S is shard S's replica 0, its first primary. "
          "The run restarts what dies.");
ABSL_FLAG(int, max_restarts, 3, "Times one process may be restarted; one more death ends the run.");
ABSL_FLAG(bool, worker_identity, false,
          "Bind each worker to a token of its own (ps --worker_identity): worker R gets "
          "<run_dir>/worker-R.token, made from the write token (--token_file, else $PS_TOKEN, "
          "else a fresh one written to <run_dir>/token), and no worker holds the write token.");
ABSL_FLAG(std::string, read_token_file, "",
          "File holding a read-only token: the shards accept it and the evaluator uses it.");
ABSL_FLAG(std::string, replication_token_file, "",
          "With --replicas=2 and a token or --tls_dir: file holding the token a shard's replicas "
          "prove themselves to each other with (the job's tokens cannot replicate); default: a "
          "fresh one written to <run_dir>/replication-token.");

namespace ps {
namespace {

int Fail(const std::string& reason) { return FailMain("launch", reason); }

// Fashion-MNIST's published MLP result (256-128-100), what this project's networks are measured
// against unless the job gives --target_accuracy.
constexpr double kPublishedMlpAccuracy = 0.8833;

// What the run's accuracy is measured against (ReferenceAccuracy), as the summary and plot name
// it; "" when nothing.
std::string ReferenceName(const TrainingConfig& c) {
  const double reference = ReferenceAccuracy(c.model, c.target_accuracy, kPublishedMlpAccuracy);
  if (reference == 0) return "";
  return absl::StrFormat(
      "%s (%.4f)", c.target_accuracy > 0 ? "target accuracy" : "published MLP baseline", reference);
}

// gnuplot script for test accuracy and training loss against wall time (seconds since start).
std::string PlotScript(const TrainingConfig& c, double t0) {
  const double reference = ReferenceAccuracy(c.model, c.target_accuracy, kPublishedMlpAccuracy);
  const std::string reference_line =
      reference == 0 ? ""
                     : absl::StrFormat(", \\\n     %.4f with lines dt 2 lc rgb 'gray40' title '%s'",
                                       reference, ReferenceName(c));
  return absl::StrFormat(R"(# Regenerate with: gnuplot plot.gp (in this directory)
set datafile separator ','
set terminal pngcairo size 1000,900 font ',11' noenhanced
set output 'training.png'
t0 = %.3f
set multiplot layout 2,1 title '%s%d workers'
set grid
set key bottom right
set title 'Test accuracy (evaluator)'
set xlabel 'wall time (s)'
set ylabel 'accuracy'
plot 'evaluator.csv' every ::1 using ($1-t0):4 with linespoints pt 7 ps 0.5 title 'test accuracy'%s
set title 'Training loss (per worker, mean over 2 s bins) and test loss'
set ylabel 'loss'
set key top right
set logscale y
plot for [i=0:%d] sprintf('worker-%%d.csv', i) every ::1 \
       using (floor(($2-t0)/2)*2):3 smooth unique with lines title sprintf('worker %%d', i), \
     'evaluator.csv' every ::1 using ($1-t0):3 with linespoints pt 7 ps 0.5 lw 2 title 'test loss'
unset multiplot
)",
                         t0, IsLayoutSpec(c.model) ? "" : "Fashion-MNIST, ", c.workers,
                         reference_line, c.workers - 1);
}

// The shards' learning-rate schedule flags. A run bounded by --steps has a known length: each
// shard applies steps x workers updates (steps rounds under sync), over which cosine decays.
absl::StatusOr<std::vector<std::string>> ScheduleFlags(const std::string& schedule,
                                                       const std::string& consistency,
                                                       const JobSpec& job) {
  if (schedule == "auto" && job.steps == 0) return std::vector<std::string>{};
  if (schedule == "cosine" || schedule == "auto") {
    if (job.steps <= 0) return absl::InvalidArgumentError("--lr_schedule=cosine needs --steps");
    const int64_t updates = consistency == "sync" ? job.steps : job.steps * job.workers;
    return std::vector<std::string>{"--lr_schedule=cosine",
                                    absl::StrCat("--lr_total_updates=", updates)};
  }
  if (schedule != "constant" && schedule != "step") {
    return absl::InvalidArgumentError(absl::StrCat("unknown --lr_schedule '", schedule,
                                                   "': expected auto, constant, cosine or step"));
  }
  return std::vector<std::string>{"--lr_schedule=" + schedule};
}

// The job the flags describe: the shared ones' (JobFromSharedFlags), the model, limits, the
// shards' consistency, optimizer and schedule, and the workers' own flags.
absl::StatusOr<JobSpec> JobFromFlags() {
  JobSpec job;
  JobFromSharedFlags(&job);
  job.workers = absl::GetFlag(FLAGS_workers);
  if (job.shards < 1 || job.workers < 1) {
    return absl::InvalidArgumentError("--shards and --workers must be positive");
  }
  job.model = absl::GetFlag(FLAGS_model);
  job.steps = absl::GetFlag(FLAGS_steps);
  job.max_seconds = absl::GetFlag(FLAGS_max_seconds);
  job.seed = absl::GetFlag(FLAGS_seed);
  job.eval_interval_seconds = absl::GetFlag(FLAGS_eval_interval_seconds);
  job.ps_flags = {"--consistency=" + absl::GetFlag(FLAGS_consistency),
                  absl::StrCat("--backup_workers=", absl::GetFlag(FLAGS_backup_workers)),
                  "--optimizer=" + absl::GetFlag(FLAGS_optimizer),
                  absl::StrCat("--lr=", absl::GetFlag(FLAGS_lr)),
                  absl::StrCat("--momentum=", absl::GetFlag(FLAGS_momentum))};
  absl::StatusOr<std::vector<std::string>> schedule =
      ScheduleFlags(absl::GetFlag(FLAGS_lr_schedule), absl::GetFlag(FLAGS_consistency), job);
  if (!schedule.ok()) return schedule.status();
  job.ps_flags.insert(job.ps_flags.end(), schedule->begin(), schedule->end());
  job.worker_flags = LocalModelFlags(
      absl::GetFlag(FLAGS_consistency), absl::GetFlag(FLAGS_lr), absl::GetFlag(FLAGS_momentum),
      absl::c_linear_search(*schedule, std::string("--lr_schedule=cosine")));
  job.extra_ps_flags = absl::GetFlag(FLAGS_ps_flags);
  job.straggler = absl::GetFlag(FLAGS_straggler);
  return job;
}

// TLS (--tls_dir) and the tokens.
ClusterSecurity SecurityFromFlags() {
  ClusterSecurity security;
  if (std::string dir = absl::GetFlag(FLAGS_tls_dir); !dir.empty()) {
    security = ClusterSecurity::MutualTls(dir);
  }
  security.token_file = absl::GetFlag(FLAGS_token_file);
  security.worker_identity = absl::GetFlag(FLAGS_worker_identity);
  security.read_token_file = absl::GetFlag(FLAGS_read_token_file);
  security.replication_token_file = absl::GetFlag(FLAGS_replication_token_file);
  return security;
}

// How the run survives deaths: replicas or checkpoints (by default in the run directory), the
// kills to inject, which need one of them for a shard, and the restarts allowed.
absl::Status SetRecoveryFromFlags(TrainingConfig& c) {
  c.replicas = absl::GetFlag(FLAGS_replicas);
  if (c.replicas != 1 && c.replicas != 2) {
    return absl::InvalidArgumentError("--replicas must be 1 or 2");
  }
  c.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  if (c.replicas > 1 && !c.checkpoint_dir.empty() && c.checkpoint_dir != "none") {
    return absl::InvalidArgumentError(
        "--replicas=2 replaces checkpoints in launch (both replicas of a shard would "
        "write one directory); drop --checkpoint_dir");
  }
  if (c.checkpoint_dir.empty() && c.replicas == 1) c.checkpoint_dir = c.run_dir + "/checkpoints";
  if (c.checkpoint_dir == "none") c.checkpoint_dir.clear();
  c.ps_flags.insert(c.ps_flags.begin(),
                    absl::StrCat("--checkpoint_seconds=", absl::GetFlag(FLAGS_checkpoint_seconds)));
  absl::StatusOr<std::vector<Kill>> kills =
      ParseKillPlan(absl::GetFlag(FLAGS_kill), c.shards, c.workers);
  if (!kills.ok()) return kills.status();
  for (const Kill& k : *kills) {
    if (k.role == Kill::Role::kShard && c.checkpoint_dir.empty() && c.replicas == 1) {
      return absl::InvalidArgumentError(
          "--kill=ps:... needs checkpoints (not --checkpoint_dir=none) or --replicas=2");
    }
  }
  c.kills = *std::move(kills);
  c.max_restarts = absl::GetFlag(FLAGS_max_restarts);
  return absl::OkStatus();
}

// The run the command line asks for; fails with a one-line reason.
absl::StatusOr<TrainingConfig> ConfigFromFlags(int argc, char** argv) {
  absl::StatusOr<JobSpec> job = JobFromFlags();
  if (!job.ok()) return job.status();
  absl::StatusOr<TrainingConfig> c = MakeTrainingConfig(*job);
  if (!c.ok()) return c.status();
  c->command = absl::StrJoin(std::vector<std::string>(argv, argv + argc), " ");
  c->target_accuracy = absl::GetFlag(FLAGS_target_accuracy);
  c->progress_seconds = absl::GetFlag(FLAGS_progress_seconds);
  c->security = SecurityFromFlags();
  c->run_dir = absl::GetFlag(FLAGS_run_dir);
  if (c->run_dir.empty()) {
    c->run_dir = "runs/" + absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone());
  }
  if (absl::Status s = SetRecoveryFromFlags(*c); !s.ok()) return s;
  return c;
}

// Writes plot.gp into the run directory and runs gnuplot on it (training.png).
void Plot(const TrainingConfig& c, const TrainingResult& r) {
  std::ofstream(c.run_dir + "/plot.gp") << PlotScript(c, r.start_unix_seconds);
  if (std::system(absl::StrCat("cd '", c.run_dir, "' && gnuplot plot.gp 2> plot.log").c_str()) !=
      0) {
    PS_LOG(WARNING) << "plotting failed (is gnuplot installed?); see " << c.run_dir << "/plot.log";
  }
}

// The run's outcome on stdout: steps, test accuracy (against the run's reference accuracy, if
// any), recoveries.
void PrintSummary(const TrainingConfig& c, const TrainingResult& r) {
  const double reference = ReferenceAccuracy(c.model, c.target_accuracy, kPublishedMlpAccuracy);
  AccuracySummary a =
      SummariseAccuracy(c.run_dir + "/evaluator.csv", r.start_unix_seconds, reference);
  const std::string reached =
      reference == 0 ? ""
      : std::isnan(a.target_at)
          ? absl::StrCat("; ", ReferenceName(c), " not reached")
          : absl::StrFormat("; %s reached after %.0f s", ReferenceName(c), a.target_at);
  std::cout << absl::StrFormat(
                   "finished: %d steps in %.1f s, final test accuracy %.4f (best %.4f at %.0f "
                   "s%s)\nrun directory: %s (training.png, evaluator.csv, worker-*.csv, logs)",
                   r.worker_steps, r.seconds, a.final_accuracy, a.best, a.best_at, reached,
                   c.run_dir)
            << std::endl;
  if (r.recoveries.empty()) return;
  int64_t lost = 0;
  for (const v1::StatsResponse& s : r.shard_stats) lost += std::max<int64_t>(s.updates_lost(), 0);
  std::cout << "recovered " << r.recoveries.size() << " time(s) (" << lost
            << " update(s) lost with restarted shards):\n";
  for (const std::string& line : r.recoveries) std::cout << "  " << line << "\n";
  std::cout << std::flush;
}

int Main(int argc, char** argv) {
  std::vector<char*> args = ParseFlagsOrHelp(
      argc, argv, "launch",
      "Starts a local cluster (shards, workers, evaluator) training Fashion-MNIST.\n"
      "Example: launch --shards=2 --workers=4 --consistency=ssp:2 --straggler=3:4");
  if (args.size() > 1) return Fail(absl::StrCat("unexpected argument '", args[1], "'"));
  absl::StatusOr<TrainingConfig> c = ConfigFromFlags(argc, argv);
  if (!c.ok()) return Fail(std::string(c.status().message()));
  SetLogTag("launch");
  // Every daemon's flags checked by the daemon itself before anything starts (or is created).
  if (absl::Status s = CheckTrainingConfig(*c); !s.ok()) return Fail(std::string(s.message()));
  InstallShutdownHandler();

  std::cout << "run directory: " << c->run_dir << "\n"
            << c->shards << " shards, " << c->workers << " workers, "
            << absl::GetFlag(FLAGS_consistency) << ", optimizer " << absl::GetFlag(FLAGS_optimizer)
            << " lr " << absl::GetFlag(FLAGS_lr) << std::endl;
  TrainingResult r = RunTraining(*c, std::cout);
  if (r.shard_stats.empty() && !r.failure.empty()) return Fail(r.failure);
  Plot(*c, r);
  PrintSummary(*c, r);
  if (!r.failure.empty()) return Fail(r.failure);
  return r.interrupted ? 130 : 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
