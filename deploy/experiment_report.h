// What `experiment` writes about its runs: per run, the staleness histogram, the training loss and
// the test accuracy against seconds, updates and epochs (CSV files in the run's directory); for
// the whole matrix, plots with one line per run (runs of one configuration share a colour, so
// the spread over seeds shows) and summary.md, a table of each configuration's mean and standard
// deviation over its seeds and a table of every run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deploy/training_run.h"

namespace ps {

struct ExperimentRun {
  std::string config;     // the configuration (mode, workers, straggler, ...): what seeds repeat
  std::string name;       // the run's directory in the report: config, and the seed if several
  std::string mode;       // experiment --modes
  std::string straggler;  // RANK:FACTOR or none
  int workers = 0;
  uint64_t seed = 0;
  double examples_per_update = 0;  // training examples behind one applied update
  TrainingResult result;
  // Filled by SummariseRun.
  AccuracySummary accuracy;
  double mean_staleness = 0, p50 = 0, p99 = 0;
  int64_t max_staleness = 0, dropped = 0, updates = 0;
};

// Writes `run_dir`'s staleness.csv (all shards), train_loss.csv (mean over workers, 2 s bins)
// and accuracy.csv (seconds, updates, epochs, accuracy: epochs = updates x examples per update /
// 60,000); fills run's summary fields, timing `target` (test accuracy; 0: none).
void SummariseRun(const std::string& run_dir, double target, ExperimentRun& run);

// Writes plots.gp into `report`, draws it with gnuplot (a warning if that fails) and writes
// summary.md: `command` and `settings` (a sentence) head it; `target` 0: none (no time-to).
void WriteReport(const std::string& report, const std::vector<ExperimentRun>& runs, double target,
                 const std::string& command, const std::string& settings);

}  // namespace ps
