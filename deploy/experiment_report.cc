#include "deploy/experiment_report.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"

namespace ps {
namespace {

constexpr double kTrainingExamples = 60000;

// Sums the shards' staleness histograms into staleness.csv; fills the staleness fields.
void SummariseStaleness(const std::string& dir, ExperimentRun& run) {
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

// The evaluator's rows as accuracy.csv: seconds, updates, epochs, accuracy.
void WriteAccuracy(const std::string& dir, const ExperimentRun& run) {
  std::ifstream in(dir + "/evaluator.csv");
  std::ofstream out(dir + "/accuracy.csv");
  out << "seconds,updates,epochs,accuracy\n";
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    const double t = CsvField(line, 0) - run.result.start_unix_seconds;
    const double updates = CsvField(line, 1), accuracy = CsvField(line, 3);
    if (std::isnan(updates) || std::isnan(accuracy)) continue;
    out << absl::StrFormat("%.3f,%.0f,%.4f,%.4f\n", t, updates,
                           updates * run.examples_per_update / kTrainingExamples, accuracy);
  }
}

// Mean and sample standard deviation of the values that are not NaN, and how many there were.
struct Spread {
  double mean = NAN, sd = NAN;
  int n = 0;
};
Spread SpreadOf(const std::vector<double>& values) {
  Spread s;
  double sum = 0, squares = 0;
  for (double v : values) {
    if (std::isnan(v)) continue;
    sum += v;
    ++s.n;
  }
  if (s.n == 0) return s;
  s.mean = sum / s.n;
  for (double v : values) {
    if (!std::isnan(v)) squares += (v - s.mean) * (v - s.mean);
  }
  s.sd = s.n > 1 ? std::sqrt(squares / (s.n - 1)) : 0;
  return s;
}

std::string Cell(double v, const absl::FormatSpec<double>& format) {
  return std::isnan(v) ? "-" : absl::StrFormat(format, v);
}

// "mean ± sd", with "(k of n)" when only k of the n runs have a value.
std::string Cell(const Spread& s, int runs, const absl::FormatSpec<double>& format) {
  if (s.n == 0) return "-";
  std::string cell =
      absl::StrCat(absl::StrFormat(format, s.mean), " ± ", absl::StrFormat(format, s.sd));
  if (s.n < runs) absl::StrAppend(&cell, " (", s.n, " of ", runs, ")");
  return cell;
}

// The configurations in the order of their first run.
std::vector<std::string> Configs(const std::vector<ExperimentRun>& runs) {
  std::vector<std::string> configs;
  for (const ExperimentRun& r : runs) {
    if (std::find(configs.begin(), configs.end(), r.config) == configs.end()) {
      configs.push_back(r.config);
    }
  }
  return configs;
}

// One gnuplot `plot` of `file` (x column : y column) for every run: a configuration's runs share
// a colour and only its first is titled.
std::string PlotRuns(const std::vector<ExperimentRun>& runs, const std::string& file,
                     const std::string& using_columns) {
  std::vector<std::string> configs = Configs(runs);
  std::vector<std::string> lines;
  std::vector<bool> titled(configs.size(), false);
  for (const ExperimentRun& r : runs) {
    size_t c = std::find(configs.begin(), configs.end(), r.config) - configs.begin();
    lines.push_back(absl::StrFormat("'%s/%s' every ::1 using %s with lines lw 1.5 lc %d %s", r.name,
                                    file, using_columns, c + 1,
                                    titled[c] ? "notitle" : "title '" + r.config + "'"));
    titled[c] = true;
  }
  return "plot " + absl::StrJoin(lines, ", \\\n     ");
}

std::string PlotScript(const std::vector<ExperimentRun>& runs, double target) {
  std::vector<std::string> configs = Configs(runs);
  std::string script = absl::StrFormat(
      R"(# Regenerate with: gnuplot plots.gp (in this directory)
set datafile separator ','
set terminal pngcairo size 1100,700 font ',11' noenhanced
set grid
set key outside right
set ylabel 'test accuracy'
set yrange [0.6:0.95]
set output 'accuracy_vs_time.png'
set title 'Test accuracy against wall time (one line per run; a colour per configuration)'
set xlabel 'wall time (s)'
%s%s
set output 'accuracy_vs_updates.png'
set title 'Test accuracy against applied updates (shard version)'
set xlabel 'applied updates'
%s
set output 'accuracy_vs_epochs.png'
set title 'Test accuracy against epochs (training examples behind the applied updates / 60,000)'
set xlabel 'epochs'
%s
set output 'training_loss.png'
set title 'Training loss (mean over workers, 2 s bins)'
set xlabel 'wall time (s)'
set ylabel 'training loss'
set autoscale y
set logscale y
%s
unset logscale y
)",
      PlotRuns(runs, "accuracy.csv", "1:4"),
      target > 0 ? absl::StrFormat(", \\\n     %.4f with lines dt 2 lc rgb 'gray40' title 'target'",
                                   target)
                 : "",
      PlotRuns(runs, "accuracy.csv", "2:4"), PlotRuns(runs, "accuracy.csv", "3:4"),
      PlotRuns(runs, "train_loss.csv", "1:2"));
  // Staleness: each configuration's first run.
  const size_t rows = (configs.size() + 1) / 2;
  absl::StrAppendFormat(&script, R"(set output 'staleness.png'
set terminal pngcairo size 1100,%d font ',10' noenhanced
set multiplot layout %d,2 title 'Staleness of applied pushes (all shards; first seed)'
unset key
set style fill solid 0.6
set boxwidth 0.9
set xlabel 'staleness (versions)'
set ylabel 'share of pushes'
)",
                        260 * rows, rows);
  for (const std::string& config : configs) {
    const ExperimentRun& r = *std::find_if(
        runs.begin(), runs.end(), [&](const ExperimentRun& x) { return x.config == config; });
    absl::StrAppendFormat(&script, R"(set title '%s'
set autoscale
stats '%s/staleness.csv' every ::1 using 1:2 nooutput
total = STATS_sum_y
set xrange [-0.5:(STATS_max_x < 4 ? 4 : STATS_max_x) + 0.5]
set yrange [0:1]
plot '%s/staleness.csv' every ::1 using 1:($2/total) with boxes
)",
                          config, r.name, r.name);
  }
  return script + "unset multiplot\n";
}

}  // namespace

void SummariseRun(const std::string& run_dir, double target, ExperimentRun& run) {
  run.accuracy =
      SummariseAccuracy(run_dir + "/evaluator.csv", run.result.start_unix_seconds, target);
  SummariseStaleness(run_dir, run);
  WriteTrainingLoss(run_dir, run.workers, run.result.start_unix_seconds);
  WriteAccuracy(run_dir, run);
}

void WriteReport(const std::string& report, const std::vector<ExperimentRun>& runs, double target,
                 const std::string& command, const std::string& settings) {
  std::ofstream(report + "/plots.gp") << PlotScript(runs, target);
  if (std::system(absl::StrCat("cd '", report, "' && gnuplot plots.gp 2> plots.log").c_str()) !=
      0) {
    PS_LOG(WARNING) << "plotting failed; see " << report << "/plots.log";
  }
  std::ofstream md(report + "/summary.md");
  md << "# Experiment report\n\nCommand: `" << command << "`\n\n" << settings << "\n\n";
  // The time to the target, or "-" throughout without one (--target_accuracy).
  const std::string time_to =
      target > 0 ? absl::StrFormat("time to %.2f (s)", target) : "time to a target (none set)";
  md << "| configuration | runs | " << time_to
     << " | final acc | best acc | epochs | updates | steps/s |\n"
        "|---|---|---|---|---|---|---|---|\n";
  for (const std::string& config : Configs(runs)) {
    std::vector<double> target_at, final_accuracy, best, epochs, updates, rate;
    int count = 0;
    for (const ExperimentRun& r : runs) {
      if (r.config != config) continue;
      ++count;
      target_at.push_back(r.accuracy.target_at);
      final_accuracy.push_back(r.accuracy.final_accuracy);
      best.push_back(r.accuracy.best);
      epochs.push_back(r.updates * r.examples_per_update / kTrainingExamples);
      updates.push_back(static_cast<double>(r.updates));
      rate.push_back(r.result.worker_steps / std::max(r.result.seconds, 1e-9));
    }
    md << absl::StrFormat(
        "| %s | %d | %s | %s | %s | %s | %s | %s |\n", config, count,
        Cell(SpreadOf(target_at), count, "%.1f"), Cell(SpreadOf(final_accuracy), count, "%.4f"),
        Cell(SpreadOf(best), count, "%.4f"), Cell(SpreadOf(epochs), count, "%.2f"),
        Cell(SpreadOf(updates), count, "%.0f"), Cell(SpreadOf(rate), count, "%.1f"));
  }
  md << "\nMean ± sample standard deviation over the configuration's runs (seeds); \"(k of n)\": "
        "only k of its n runs have a value (for the time to the target: reached it). Every "
        "run:\n\n";
  md << "| run | " << time_to
     << " | final acc | best acc | steps/s | updates/s | staleness mean | p50 | p99 | max | "
        "dropped |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const ExperimentRun& r : runs) {
    double seconds = std::max(r.result.seconds, 1e-9);
    md << absl::StrFormat("| %s | %s | %s | %s | %.1f | %.1f | %.2f | %.0f | %.0f | %d | %d |%s\n",
                          r.name, Cell(r.accuracy.target_at, "%.1f"),
                          Cell(r.accuracy.final_accuracy, "%.4f"), Cell(r.accuracy.best, "%.4f"),
                          r.result.worker_steps / seconds, r.updates / seconds, r.mean_staleness,
                          r.p50, r.p99, r.max_staleness, r.dropped,
                          r.result.failure.empty() ? "" : " (failed: " + r.result.failure + ")");
  }
  md << "\nsteps = gradients (or local steps) computed by all workers; updates = versions applied "
        "by a shard (under sync one update averages a round of gradients); epochs = updates x "
        "the training examples behind one update / 60,000; staleness is over all applied pushes "
        "on all shards; dropped counts shard pushes dropped by the policy.\n\n"
        "![accuracy vs epochs](accuracy_vs_epochs.png)\n![accuracy vs updates]"
        "(accuracy_vs_updates.png)\n![accuracy vs time](accuracy_vs_time.png)\n"
        "![training loss](training_loss.png)\n![staleness](staleness.png)\n";
}

}  // namespace ps
