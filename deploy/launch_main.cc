// launch: runs a whole cluster on this machine (S shards + W workers + the evaluator on 127.0.0.1
// with free ports), shows progress, stops everything cleanly at the end or on Ctrl-C, and leaves a
// run directory with the configuration, CSVs, logs and plots.
#include <signal.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/shutdown.h"
#include "deploy/local_cluster.h"

ABSL_FLAG(int, shards, 2, "Parameter-server shards.");
ABSL_FLAG(int, workers, 4, "Workers.");
ABSL_FLAG(std::string, run_dir, "", "Run directory (default runs/<date-time>).");
ABSL_FLAG(double, max_seconds, 120, "Stop training after this many seconds; 0: no limit.");
ABSL_FLAG(int64_t, steps, 0, "Steps per worker; 0: no limit.");
ABSL_FLAG(double, target_accuracy, 0, "Stop once the evaluator reports this test accuracy; 0: off.");
ABSL_FLAG(std::string, optimizer, "momentum", "Server optimizer: sgd|momentum|nesterov|adam|adagrad.");
ABSL_FLAG(double, lr, 0.01, "Learning rate.");
ABSL_FLAG(double, momentum, 0.9, "Momentum coefficient.");
ABSL_FLAG(std::string, hidden, "256,128", "MLP hidden layer sizes.");
ABSL_FLAG(int, batch_size, 64, "Minibatch size per worker.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of initial weights and batch order.");
ABSL_FLAG(std::string, device, "cpu", "Workers' device: auto | cpu | cuda | cuda:N.");
ABSL_FLAG(double, eval_interval_seconds, 2, "Seconds between evaluations.");
ABSL_FLAG(double, progress_seconds, 5, "Seconds between progress lines.");

namespace ps {
namespace {

int Fail(const std::string& reason) { return FailMain("launch", reason); }

// Field `column` of a CSV line, or NaN.
double Field(const std::string& line, int column) {
  std::vector<std::string> f = absl::StrSplit(line, ',');
  double v = 0;
  return column < static_cast<int>(f.size()) && absl::SimpleAtod(f[column], &v) ? v : NAN;
}

// The best test accuracy in the evaluator's CSV, the seconds after `t0` it was reached, and the
// seconds until accuracy first reached `target` (NaN if never).
struct AccuracySummary {
  double best = NAN, best_at = NAN, target_at = NAN;
};
AccuracySummary SummariseAccuracy(const std::string& csv, double t0, double target) {
  AccuracySummary s;
  std::ifstream in(csv);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    double t = Field(line, 0) - t0, accuracy = Field(line, 3);
    if (!(s.best >= accuracy)) s = {accuracy, t, s.target_at};
    if (accuracy >= target && s.target_at != s.target_at) s.target_at = t;
  }
  return s;
}

// Steps finished by all workers, from the last row of each worker's CSV.
int64_t StepsDone(const std::string& run_dir, int workers) {
  int64_t total = 0;
  for (int r = 0; r < workers; ++r) {
    double step = Field(LastLine(absl::StrCat(run_dir, "/worker-", r, ".csv")), 0);
    if (step == step) total += static_cast<int64_t>(step) + 1;
  }
  return total;
}

// gnuplot script for test accuracy and training loss against wall time (seconds since start).
std::string PlotScript(double t0, int workers) {
  return absl::StrFormat(R"(# Regenerate with: gnuplot plot.gp (in this directory)
set datafile separator ','
set terminal pngcairo size 1000,900 font ',11'
set output 'training.png'
t0 = %.3f
set multiplot layout 2,1 title 'Fashion-MNIST, %d workers'
set grid
set key bottom right
set title 'Test accuracy (evaluator)'
set xlabel 'wall time (s)'
set ylabel 'accuracy'
plot 'evaluator.csv' every ::1 using ($1-t0):4 with linespoints pt 7 ps 0.5 title 'test accuracy', \
     0.8833 with lines dt 2 lc rgb 'gray40' title 'published MLP baseline (0.8833)'
set title 'Training loss (per worker, mean over 2 s bins) and test loss'
set ylabel 'loss'
set key top right
set logscale y
plot for [i=0:%d] sprintf('worker-%%d.csv', i) every ::1 \
       using (floor(($2-t0)/2)*2):3 smooth unique with lines title sprintf('worker %%d', i), \
     'evaluator.csv' every ::1 using ($1-t0):3 with linespoints pt 7 ps 0.5 lw 2 title 'test loss'
unset multiplot
)",
                         t0, workers, workers - 1);
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Starts a local cluster (shards, workers, evaluator) training Fashion-MNIST.\n"
      "Example: launch --shards=2 --workers=4 --max_seconds=300");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() > 1) return Fail(absl::StrCat("unexpected argument '", args[1], "'"));
  const int shards = absl::GetFlag(FLAGS_shards), workers = absl::GetFlag(FLAGS_workers);
  if (shards < 1 || workers < 1) return Fail("--shards and --workers must be positive");
  SetLogTag("launch");
  InstallShutdownHandler();

  std::string run_dir = absl::GetFlag(FLAGS_run_dir);
  if (run_dir.empty()) {
    mkdir("runs", 0755);
    run_dir = "runs/" + absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone());
  }
  std::vector<std::string> ps_flags = {
      "--optimizer=" + absl::GetFlag(FLAGS_optimizer),
      absl::StrCat("--lr=", absl::GetFlag(FLAGS_lr)),
      absl::StrCat("--momentum=", absl::GetFlag(FLAGS_momentum))};
  std::vector<std::string> worker_flags = {
      "--hidden=" + absl::GetFlag(FLAGS_hidden),
      absl::StrCat("--batch_size=", absl::GetFlag(FLAGS_batch_size)),
      absl::StrCat("--steps=", absl::GetFlag(FLAGS_steps)),
      absl::StrCat("--max_seconds=", absl::GetFlag(FLAGS_max_seconds)),
      absl::StrCat("--seed=", absl::GetFlag(FLAGS_seed)), "--device=" + absl::GetFlag(FLAGS_device),
      "--threads=1"};
  std::vector<std::string> evaluator_flags = {
      "--hidden=" + absl::GetFlag(FLAGS_hidden),
      absl::StrCat("--interval_seconds=", absl::GetFlag(FLAGS_eval_interval_seconds))};

  LocalCluster cluster(ExecutableDir(), run_dir);
  const absl::Time start = absl::Now();
  if (absl::Status s = cluster.StartShards(shards, ps_flags); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  {
    std::ofstream config(run_dir + "/config.txt");
    config << "command:";
    for (int i = 0; i < argc; ++i) config << " " << argv[i];
    config << "\nstarted: " << absl::FormatTime(start) << "\nps addresses: "
           << cluster.ShardAddresses() << "\nps flags: " << absl::StrJoin(ps_flags, " ")
           << "\nworker flags: " << absl::StrJoin(worker_flags, " ")
           << "\nevaluator flags: " << absl::StrJoin(evaluator_flags, " ") << "\n";
  }
  std::string failure;
  if (absl::Status s = cluster.StartEvaluator(evaluator_flags); !s.ok()) failure = std::string(s.message());
  for (int r = 0; r < workers && failure.empty(); ++r) {
    if (absl::Status s = cluster.StartWorker(r, workers, worker_flags); !s.ok()) failure = std::string(s.message());
  }
  std::cout << "run directory: " << run_dir << "\n"
            << shards << " shards at " << cluster.ShardAddresses() << ", " << workers
            << " workers, optimizer " << absl::GetFlag(FLAGS_optimizer) << " lr "
            << absl::GetFlag(FLAGS_lr) << std::endl;

  const double target = absl::GetFlag(FLAGS_target_accuracy);
  const double max_seconds = absl::GetFlag(FLAGS_max_seconds);
  int64_t last_steps = 0;
  absl::Time last_time = start;
  while (failure.empty()) {
    bool interrupted = WaitForShutdown(absl::Seconds(absl::GetFlag(FLAGS_progress_seconds)));
    absl::Time now = absl::Now();
    int64_t steps = StepsDone(run_dir, workers);
    std::string eval = LastLine(run_dir + "/evaluator.csv");
    double accuracy = Field(eval, 3);
    std::cout << absl::StrFormat("[%6.1fs] %8d updates, %7.1f updates/s, test accuracy %s",
                                 absl::ToDoubleSeconds(now - start), steps,
                                 (steps - last_steps) / absl::ToDoubleSeconds(now - last_time),
                                 accuracy == accuracy ? absl::StrFormat("%.4f", accuracy) : "-")
              << std::endl;
    last_steps = steps;
    last_time = now;
    if (interrupted) {
      std::cout << "interrupted: stopping the cluster" << std::endl;
      break;
    }
    if (target > 0 && accuracy >= target) {
      std::cout << "reached target accuracy " << target << std::endl;
      break;
    }
    bool any_running = false;
    for (int r = 0; r < workers; ++r) {
      Subprocess* w = cluster.worker(r);
      if (w->running()) {
        any_running = true;
      } else if (absl::StatusOr<int> code = w->Wait(absl::ZeroDuration()); *code != 0) {
        failure = absl::StrCat("worker ", r, " exited with status ", *code, "; see ", run_dir,
                               "/worker-", r, ".log");
      }
    }
    if (!any_running) break;
    if (max_seconds > 0 && now - start > absl::Seconds(max_seconds + 30)) {
      failure = "workers did not stop within 30 s of --max_seconds";
    }
    for (Subprocess& s : cluster.shards()) {
      if (!s.running()) failure = absl::StrCat(s.name(), " (pid ", s.pid(), ") exited early");
    }
  }
  std::string stop_problems = cluster.Stop();
  if (failure.empty() && !ShutdownRequested()) failure = stop_problems;

  std::ofstream(run_dir + "/plot.gp") << PlotScript(absl::ToDoubleSeconds(start - absl::UnixEpoch()), workers);
  if (std::system(absl::StrCat("cd '", run_dir, "' && gnuplot plot.gp 2> plot.log").c_str()) != 0) {
    PS_LOG(WARNING) << "plotting failed (is gnuplot installed?); see " << run_dir << "/plot.log";
  }
  double accuracy = Field(LastLine(run_dir + "/evaluator.csv"), 3);
  const double baseline = 0.8833;  // the dataset's published MLP 256-128-100 result
  AccuracySummary summary = SummariseAccuracy(run_dir + "/evaluator.csv",
                                              absl::ToDoubleSeconds(start - absl::UnixEpoch()),
                                              baseline);
  std::cout << absl::StrFormat(
                   "finished: %d updates in %.1f s, final test accuracy %.4f (best %.4f at "
                   "%.0f s; first >= %.4f %s)\nrun directory: %s (training.png, evaluator.csv, "
                   "worker-*.csv, logs)",
                   StepsDone(run_dir, workers), absl::ToDoubleSeconds(absl::Now() - start),
                   accuracy, summary.best, summary.best_at, baseline,
                   summary.target_at == summary.target_at
                       ? absl::StrFormat("after %.0f s", summary.target_at)
                       : "not reached",
                   run_dir)
            << std::endl;
  if (!failure.empty()) return Fail(failure);
  return ShutdownRequested() ? 130 : 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
