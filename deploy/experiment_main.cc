// experiment: runs a matrix of training runs (consistency modes x worker counts x straggler
// settings x seeds) on local clusters and writes a report directory: every run's CSVs and logs,
// PNG plots with one line per configuration, and a markdown table of the results.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/consistency_spec.h"
#include "common/log.h"
#include "common/model_spec.h"
#include "common/shutdown.h"
#include "deploy/local_cluster.h"
#include "deploy/training_run.h"

ABSL_FLAG(std::string, preset, "",
          "straggler: 4 workers with one 4x straggler under sync, sync-backup1, async, async-slr, "
          "ssp:1, ssp:4 and dcasgd. Explicit flags below override the preset's.");
ABSL_FLAG(std::vector<std::string>, modes, {},
          "Consistency settings: async, sync, sync-backupN, ssp:S, easgd:T[,A], local:H, "
          "async-slr (staleness-aware lr), async-maxstaleN (drop staler pushes), "
          "dcasgd[:LAMBDA].");
ABSL_FLAG(std::vector<std::string>, workers, {}, "Worker counts, e.g. 2,4,8.");
ABSL_FLAG(std::vector<std::string>, stragglers, {},
          "Straggler settings: none, or RANK:FACTOR (worker RANK computes FACTOR times slower).");
ABSL_FLAG(std::vector<std::string>, seeds, {}, "Seeds.");
ABSL_FLAG(int, shards, 2, "Parameter-server shards.");
ABSL_FLAG(double, max_seconds, 60, "Training time per configuration.");
ABSL_FLAG(double, target_accuracy, 0.85, "Accuracy whose time-to is reported.");
ABSL_FLAG(std::string, optimizer, "momentum", "Server optimizer.");
ABSL_FLAG(double, lr, 0.01, "Learning rate.");
ABSL_FLAG(std::string, hidden, "256,128", "MLP hidden layer sizes.");
ABSL_FLAG(int, batch_size, 64, "Minibatch size per worker.");
ABSL_FLAG(std::string, device, "cpu", "Workers' device: auto | cpu | cuda | cuda:N.");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist", "Fashion-MNIST IDX files.");
ABSL_FLAG(std::string, worker_flags, "",
          "More flags for every worker, e.g. \"--push_delay=exp:0.01\".");
ABSL_FLAG(std::string, report_dir, "", "Report directory (default reports/<date-time>).");

namespace ps {
namespace {

int Fail(const std::string& reason) { return FailMain("experiment", reason); }

// The ps flags a mode name stands for, or an error naming it.
absl::StatusOr<std::vector<std::string>> ModeFlags(const std::string& mode) {
  int n = 0;
  double lambda = 0.04;  // DC-ASGD's lambda_0 in Zheng et al.
  if (ParseConsistencySpec(mode).ok()) return std::vector<std::string>{"--consistency=" + mode};
  if (mode.rfind("sync-backup", 0) == 0 && absl::SimpleAtoi(mode.substr(11), &n) && n >= 0) {
    return std::vector<std::string>{"--consistency=sync", absl::StrCat("--backup_workers=", n)};
  }
  if (mode == "async-slr") return std::vector<std::string>{"--consistency=async", "--staleness_lr"};
  if (mode.rfind("async-maxstale", 0) == 0 && absl::SimpleAtoi(mode.substr(14), &n) && n >= 0) {
    return std::vector<std::string>{"--consistency=async", absl::StrCat("--max_staleness=", n)};
  }
  if (mode == "dcasgd" ||
      (mode.rfind("dcasgd:", 0) == 0 && absl::SimpleAtod(mode.substr(7), &lambda))) {
    return std::vector<std::string>{"--consistency=async", absl::StrCat("--dc_lambda=", lambda)};
  }
  return absl::InvalidArgumentError("unknown mode '" + mode + "' (see --help)");
}

struct Run {
  std::string name, mode, straggler;
  int workers = 0;
  uint64_t seed = 0;
  TrainingResult result;
  AccuracySummary accuracy;
  double mean_staleness = 0, p50 = 0, p99 = 0;
  int64_t max_staleness = 0, dropped = 0, updates = 0;
};

// Sums the shards' staleness histograms; writes it as staleness.csv; fills the summary fields.
void SummariseStaleness(const std::string& dir, Run& run) {
  std::vector<int64_t> counts;
  for (const v1::StatsResponse& s : run.result.shard_stats) {
    counts.resize(std::max<size_t>(counts.size(), s.staleness_counts_size()), 0);
    for (int k = 0; k < s.staleness_counts_size(); ++k) counts[k] += s.staleness_counts(k);
    run.dropped += s.pushes_dropped_late() + s.pushes_dropped_stale();
  }
  if (!run.result.shard_stats.empty()) run.updates = run.result.shard_stats[0].version();
  std::ofstream out(dir + "/staleness.csv");
  out << "staleness,count\n";
  int64_t total = 0;
  double sum = 0;
  for (size_t k = 0; k < counts.size(); ++k) {
    out << k << "," << counts[k] << "\n";
    total += counts[k];
    sum += static_cast<double>(k) * counts[k];
  }
  if (total == 0) return;
  run.mean_staleness = sum / total;
  run.max_staleness = static_cast<int64_t>(counts.size()) - 1;
  int64_t seen = 0;
  bool have_p50 = false;
  for (size_t k = 0; k < counts.size(); ++k) {
    seen += counts[k];
    if (!have_p50 && seen * 2 >= total) {
      run.p50 = k;
      have_p50 = true;
    }
    if (seen * 100 >= total * 99) {
      run.p99 = k;
      break;
    }
  }
}

// Mean training loss over all workers in 2-second bins, as train_loss.csv (seconds, loss).
void WriteTrainingLoss(const std::string& dir, int workers, double t0) {
  std::map<int64_t, std::pair<double, int64_t>> bins;
  for (int r = 0; r < workers; ++r) {
    std::ifstream in(absl::StrCat(dir, "/worker-", r, ".csv"));
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      double t = CsvField(line, 1) - t0, loss = CsvField(line, 2);
      if (std::isnan(t) || std::isnan(loss)) continue;
      auto& [sum, n] = bins[static_cast<int64_t>(t / 2)];
      sum += loss;
      ++n;
    }
  }
  std::ofstream out(dir + "/train_loss.csv");
  out << "seconds,loss\n";
  for (const auto& [bin, v] : bins) out << bin * 2 + 1 << "," << v.first / v.second << "\n";
}

std::string PlotScript(const std::vector<Run>& runs, double target) {
  std::vector<std::string> names;
  for (const Run& r : runs) names.push_back(r.name);
  std::string list = absl::StrJoin(names, " ");
  std::string t0s;
  for (const Run& r : runs)
    absl::StrAppend(&t0s, absl::StrFormat("%.3f ", r.result.start_unix_seconds));
  return absl::StrFormat(R"(# Regenerate with: gnuplot plots.gp (in this directory)
set datafile separator ','
set terminal pngcairo size 1100,700 font ',11' noenhanced
runs = '%s'
t0s = '%s'
set grid
set key outside right
set ylabel 'test accuracy'
set yrange [0.6:0.92]
set output 'accuracy_vs_time.png'
set title 'Test accuracy against wall time'
set xlabel 'wall time (s)'
plot for [i=1:words(runs)] word(runs,i).'/evaluator.csv' every ::1 \
     using ($1-word(t0s,i)):4 with lines lw 2 title word(runs,i), \
     %.4f with lines dt 2 lc rgb 'gray40' title 'target'
set output 'accuracy_vs_updates.png'
set title 'Test accuracy against applied updates (shard version)'
set xlabel 'applied updates'
plot for [i=1:words(runs)] word(runs,i).'/evaluator.csv' every ::1 \
     using 2:4 with lines lw 2 title word(runs,i)
set output 'training_loss.png'
set title 'Training loss (mean over workers, 2 s bins)'
set xlabel 'wall time (s)'
set ylabel 'training loss'
set autoscale y
set logscale y
plot for [i=1:words(runs)] word(runs,i).'/train_loss.csv' every ::1 using 1:2 with lines lw 2 title word(runs,i)
unset logscale y
set output 'staleness.png'
set terminal pngcairo size 1100,%d font ',10' noenhanced
set multiplot layout %d,2 title 'Staleness of applied gradients (all shards)'
unset key
set style fill solid 0.6
set boxwidth 0.9
set xlabel 'staleness (versions)'
set ylabel 'share of pushes'
do for [i=1:words(runs)] {
  set title word(runs,i)
  set autoscale
  stats word(runs,i).'/staleness.csv' every ::1 using 1:2 nooutput
  total = STATS_sum_y
  set xrange [-0.5:(STATS_max_x < 4 ? 4 : STATS_max_x) + 0.5]
  set yrange [0:1]
  plot word(runs,i).'/staleness.csv' every ::1 using 1:($2/total) with boxes
}
unset multiplot
)",
                         list, t0s, target, 260 * ((runs.size() + 1) / 2), (runs.size() + 1) / 2);
}

std::string Cell(double v, const char* format) {
  return std::isnan(v) ? "-" : absl::StrFormat(format, v);
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Runs a matrix of training configurations and writes a report.\n"
      "Example: experiment --preset=straggler   or   experiment --modes=async,sync,ssp:2 "
      "--workers=2,4 --stragglers=none,0:4 --seeds=1,2");
  absl::ParseCommandLine(argc, argv);
  std::vector<std::string> modes = absl::GetFlag(FLAGS_modes),
                           workers = absl::GetFlag(FLAGS_workers),
                           stragglers = absl::GetFlag(FLAGS_stragglers),
                           seeds = absl::GetFlag(FLAGS_seeds);
  if (absl::GetFlag(FLAGS_preset) == "straggler") {
    if (modes.empty())
      modes = {"sync", "sync-backup1", "async", "async-slr", "ssp:1", "ssp:4", "dcasgd"};
    if (workers.empty()) workers = {"4"};
    if (stragglers.empty()) stragglers = {"3:4"};
  } else if (!absl::GetFlag(FLAGS_preset).empty()) {
    return Fail("unknown --preset '" + absl::GetFlag(FLAGS_preset) + "': expected straggler");
  }
  if (modes.empty()) modes = {"async", "sync"};
  if (workers.empty()) workers = {"4"};
  if (stragglers.empty()) stragglers = {"none"};
  if (seeds.empty()) seeds = {"1"};
  for (const std::string& m : modes) {
    if (absl::StatusOr<std::vector<std::string>> f = ModeFlags(m); !f.ok()) {
      return Fail(std::string(f.status().message()));
    }
  }
  std::string report = absl::GetFlag(FLAGS_report_dir);
  if (report.empty()) {
    mkdir("reports", 0755);
    report = "reports/" + absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone());
  }
  mkdir(report.c_str(), 0755);
  SetLogTag("experiment");
  InstallShutdownHandler();

  std::vector<Run> runs;
  for (const std::string& m : modes) {
    for (const std::string& w : workers) {
      for (const std::string& s : stragglers) {
        for (const std::string& seed : seeds) {
          Run run;
          run.mode = m;
          run.straggler = s;
          if (!absl::SimpleAtoi(w, &run.workers) || run.workers < 1 ||
              !absl::SimpleAtoi(seed, &run.seed)) {
            return Fail("bad --workers or --seeds entry");
          }
          run.name = absl::StrReplaceAll(absl::StrCat(m, "_w", w, s == "none" ? "" : "_strag" + s,
                                                      seeds.size() > 1 ? "_seed" + seed : ""),
                                         {{":", "-"}});
          runs.push_back(run);
        }
      }
    }
  }
  const double target = absl::GetFlag(FLAGS_target_accuracy);
  for (size_t i = 0; i < runs.size() && !ShutdownRequested(); ++i) {
    Run& run = runs[i];
    JobSpec job;
    job.shards = absl::GetFlag(FLAGS_shards);
    job.workers = run.workers;
    job.hidden = absl::GetFlag(FLAGS_hidden);
    job.batch_size = absl::GetFlag(FLAGS_batch_size);
    job.max_seconds = absl::GetFlag(FLAGS_max_seconds);
    job.seed = run.seed;
    job.device = absl::GetFlag(FLAGS_device);
    job.data_dir = absl::GetFlag(FLAGS_data_dir);
    job.ps_flags = *ModeFlags(run.mode);
    job.ps_flags.push_back("--optimizer=" + absl::GetFlag(FLAGS_optimizer));
    job.ps_flags.push_back(absl::StrCat("--lr=", absl::GetFlag(FLAGS_lr)));
    job.worker_flags = LocalModelFlags(run.mode, absl::GetFlag(FLAGS_lr), 0.9, false);
    job.extra_worker_flags = absl::GetFlag(FLAGS_worker_flags);
    if (run.straggler != "none") job.straggler = run.straggler;
    absl::StatusOr<TrainingConfig> made = MakeTrainingConfig(job);
    if (!made.ok()) return Fail(std::string(made.status().message()));
    TrainingConfig c = *std::move(made);
    c.run_dir = report + "/" + run.name;
    c.progress_seconds = 10;
    c.progress_prefix = absl::StrFormat("[%d/%d %s] ", i + 1, runs.size(), run.name);
    std::cout << c.progress_prefix << "starting: ps " << absl::StrJoin(c.ps_flags, " ")
              << std::endl;
    run.result = RunTraining(c, std::cout);
    if (!run.result.failure.empty()) {
      std::cout << c.progress_prefix << "FAILED: " << run.result.failure << std::endl;
    }
    run.accuracy =
        SummariseAccuracy(c.run_dir + "/evaluator.csv", run.result.start_unix_seconds, target);
    SummariseStaleness(c.run_dir, run);
    WriteTrainingLoss(c.run_dir, run.workers, run.result.start_unix_seconds);
  }

  std::ofstream(report + "/plots.gp") << PlotScript(runs, target);
  if (std::system(absl::StrCat("cd '", report, "' && gnuplot plots.gp 2> plots.log").c_str()) !=
      0) {
    PS_LOG(WARNING) << "plotting failed; see " << report << "/plots.log";
  }
  std::ofstream md(report + "/summary.md");
  md << "# Experiment report\n\nCommand: `";
  for (int i = 0; i < argc; ++i) md << (i ? " " : "") << argv[i];
  md << "`\n\n"
     << absl::GetFlag(FLAGS_shards) << " shards, optimizer " << absl::GetFlag(FLAGS_optimizer)
     << " lr " << absl::GetFlag(FLAGS_lr) << ", MLP " << absl::GetFlag(FLAGS_hidden) << ", batch "
     << absl::GetFlag(FLAGS_batch_size) << " per worker, " << absl::GetFlag(FLAGS_max_seconds)
     << " s per configuration.\n\n";
  md << absl::StrFormat(
      "| configuration | time to %.2f (s) | final acc | best acc | steps/s | "
      "updates/s | staleness mean | p50 | p99 | max | dropped |\n",
      target);
  md << "|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Run& r : runs) {
    double seconds = std::max(r.result.seconds, 1e-9);
    md << absl::StrFormat("| %s | %s | %s | %s | %.1f | %.1f | %.2f | %.0f | %.0f | %d | %d |%s\n",
                          r.name, Cell(r.accuracy.target_at, "%.1f"),
                          Cell(r.accuracy.final_accuracy, "%.4f"), Cell(r.accuracy.best, "%.4f"),
                          r.result.worker_steps / seconds, r.updates / seconds, r.mean_staleness,
                          r.p50, r.p99, r.max_staleness, r.dropped,
                          r.result.failure.empty() ? "" : " (failed: " + r.result.failure + ")");
  }
  md << "\nsteps = gradients computed by all workers; updates = versions applied by a shard "
        "(under sync one update averages a round of gradients); staleness is over all applied "
        "gradients on all shards; dropped counts shard pushes dropped by the policy.\n\n"
        "![accuracy vs time](accuracy_vs_time.png)\n![accuracy vs updates]"
        "(accuracy_vs_updates.png)\n![training loss](training_loss.png)\n"
        "![staleness](staleness.png)\n";
  md.close();
  std::cout << "report: " << report << "/summary.md" << std::endl;
  std::ifstream in(report + "/summary.md");
  std::cout << in.rdbuf();
  return ShutdownRequested() ? 130 : 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
