// experiment: runs a matrix of training runs (consistency modes x worker counts x straggler
// settings x seeds) on local clusters and writes a report directory: every run's CSVs and logs,
// PNG plots with one line per configuration, and a markdown table of the results.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
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
#include "common/flags_help.h"
#include "common/log.h"
#include "common/model_spec.h"
#include "common/shutdown.h"
#include "deploy/experiment_report.h"
#include "deploy/local_cluster.h"
#include "deploy/training_run.h"

ABSL_FLAG(std::string, preset, "",
          "straggler: 4 workers with one 4x straggler under sync, sync-backup1, async, async-slr, "
          "ssp:1, ssp:4 and dcasgd. batch-scaling: 1 worker, and 2 and 4 workers under sync, "
          "sync-linear and async, 3 epochs each. Both run seeds 1,2,3. Explicit flags below "
          "override the preset's.");
ABSL_FLAG(std::vector<std::string>, modes, {},
          "Consistency settings: async, sync, sync-backupN, sync-linear (lr x workers, warmed "
          "up over the first epoch), ssp:S, easgd:T[,A], local:H, "
          "async-slr (staleness-aware lr), async-maxstaleN (drop staler pushes), "
          "dcasgd[:LAMBDA].");
ABSL_FLAG(std::vector<std::string>, workers, {}, "Worker counts, e.g. 2,4,8.");
ABSL_FLAG(std::vector<std::string>, stragglers, {},
          "Straggler settings: none, or RANK:FACTOR (worker RANK computes FACTOR times slower).");
ABSL_FLAG(std::vector<std::string>, seeds, {}, "Seeds.");
ABSL_FLAG(double, max_seconds, 0,
          "Training time per run; with --epochs, its limit. 0: 60 s without --epochs, no limit "
          "with them.");
ABSL_FLAG(double, epochs, 0,
          "Train every run for this many epochs of the training set (steps per worker = epochs x "
          "60,000 / (workers x batch)); 0: for --max_seconds.");
ABSL_FLAG(double, target_accuracy, 0,
          "Test accuracy whose time-to is reported; 0: 0.85 for this project's networks "
          "(Fashion-MNIST), none for a tensor layout (your own model: give its target).");
ABSL_FLAG(std::string, optimizer, "momentum", "Server optimizer.");
ABSL_FLAG(double, lr, 0.01, "Learning rate.");
ABSL_FLAG(std::string, model, "",
          "A model spec or preset instead of the --hidden MLP; with --worker_cmd also a tensor "
          "layout (F.json).");
ABSL_FLAG(std::string, report_dir, "", "Report directory (default reports/<date-time>).");

namespace ps {
namespace {

int Fail(const std::string& reason) { return FailMain("experiment", reason); }

// The ps flags a mode name stands for, or an error naming it.
absl::StatusOr<std::vector<std::string>> ModeFlags(const std::string& mode) {
  int n = 0;
  double lambda = 0.04;  // DC-ASGD's lambda_0 in Zheng et al.
  if (ParseConsistencySpec(mode).ok()) return std::vector<std::string>{"--consistency=" + mode};
  if (mode == "sync-linear") return std::vector<std::string>{"--consistency=sync"};
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

// Training examples behind one update a shard applies under `mode`, with W workers of batch B.
double ExamplesPerUpdate(const std::string& mode, int workers, int batch) {
  int backup = 0;
  if (mode.rfind("sync-backup", 0) == 0) (void)absl::SimpleAtoi(mode.substr(11), &backup);
  if (mode.rfind("sync", 0) == 0) return std::max(1, workers - backup) * batch;
  absl::StatusOr<ConsistencySpec> spec = ParseConsistencySpec(mode);
  if (!spec.ok()) return batch;  // the async variants
  switch (spec->kind) {
    case ConsistencySpec::Kind::kLocalSgd:
      return workers * spec->period * batch;
    case ConsistencySpec::Kind::kEasgd:
      return spec->period * batch;
    default:
      return batch;
  }
}

// What the flags ask for, a preset's values where a flag is not given: the matrix's axes and how
// long each run trains.
struct RunMatrix {
  std::vector<std::string> modes, workers, stragglers, seeds;
  double epochs = 0;
  JobSpec job;  // what every run's job shares (max_seconds 0: see --max_seconds)
};

// The matrix with the preset's values and the defaults filled in; fails on an unknown preset or
// mode, or bad --epochs.
absl::StatusOr<RunMatrix> MatrixFromFlags() {
  RunMatrix m;
  m.modes = absl::GetFlag(FLAGS_modes);
  m.workers = absl::GetFlag(FLAGS_workers);
  m.stragglers = absl::GetFlag(FLAGS_stragglers);
  m.seeds = absl::GetFlag(FLAGS_seeds);
  m.epochs = absl::GetFlag(FLAGS_epochs);
  JobFromSharedFlags(&m.job);
  m.job.model = absl::GetFlag(FLAGS_model);
  m.job.max_seconds = absl::GetFlag(FLAGS_max_seconds);
  const std::string preset = absl::GetFlag(FLAGS_preset);
  if (preset == "straggler") {
    if (m.modes.empty())
      m.modes = {"sync", "sync-backup1", "async", "async-slr", "ssp:1", "ssp:4", "dcasgd"};
    if (m.workers.empty()) m.workers = {"4"};
    if (m.stragglers.empty()) m.stragglers = {"3:4"};
  } else if (preset == "batch-scaling") {
    if (m.modes.empty()) m.modes = {"sync", "sync-linear", "async"};
    if (m.workers.empty()) m.workers = {"1", "2", "4"};
    if (m.epochs == 0) m.epochs = 3;
  } else if (!preset.empty()) {
    return absl::InvalidArgumentError("unknown --preset '" + preset +
                                      "': expected straggler or batch-scaling");
  }
  if (!preset.empty() && m.seeds.empty()) m.seeds = {"1", "2", "3"};
  if (m.modes.empty()) m.modes = {"async", "sync"};
  if (m.workers.empty()) m.workers = {"4"};
  if (m.stragglers.empty()) m.stragglers = {"none"};
  if (m.seeds.empty()) m.seeds = {"1"};
  if (!(m.epochs >= 0)) return absl::InvalidArgumentError("--epochs must be >= 0");
  for (const std::string& mode : m.modes) {
    if (absl::StatusOr<std::vector<std::string>> f = ModeFlags(mode); !f.ok()) return f.status();
  }
  return m;
}

// The matrix's runs, worker count by worker count, then mode, straggler and seed. One worker
// makes every gradient mode the same SGD: only the first of them runs.
absl::StatusOr<std::vector<ExperimentRun>> PlanRuns(const RunMatrix& m) {
  std::vector<ExperimentRun> runs;
  for (const std::string& w : m.workers) {
    int count = 0;
    if (!absl::SimpleAtoi(w, &count) || count < 1) {
      return absl::InvalidArgumentError("bad --workers entry '" + w + "'");
    }
    bool one_sgd_run = false;
    for (const std::string& mode : m.modes) {
      const absl::StatusOr<ConsistencySpec> spec = ParseConsistencySpec(mode);
      const bool local_models = spec.ok() && spec->local_models();
      if (count == 1 && !local_models && std::exchange(one_sgd_run, true)) continue;
      for (const std::string& s : m.stragglers) {
        for (const std::string& seed : m.seeds) {
          ExperimentRun run;
          run.mode = mode;
          run.straggler = s;
          run.workers = count;
          if (!absl::SimpleAtoi(seed, &run.seed)) {
            return absl::InvalidArgumentError("bad --seeds entry '" + seed + "'");
          }
          run.config = absl::StrReplaceAll(
              absl::StrCat(mode, "_w", w, s == "none" ? "" : "_strag" + s), {{":", "-"}});
          run.name = m.seeds.size() > 1 ? run.config + "_seed" + seed : run.config;
          run.examples_per_update = ExamplesPerUpdate(mode, count, m.job.batch_size);
          runs.push_back(run);
        }
      }
    }
  }
  return runs;
}

// The job of one run: what every run shares, with the run's workers, seed, mode and straggler.
JobSpec RunJob(const RunMatrix& m, const ExperimentRun& run) {
  const double lr = absl::GetFlag(FLAGS_lr);
  const int batch = m.job.batch_size;
  JobSpec job = m.job;
  job.workers = run.workers;
  // --epochs: every configuration sees as many training examples.
  if (m.epochs > 0) {
    job.steps = static_cast<int64_t>(std::ceil(m.epochs * 60000 / (run.workers * batch)));
  }
  job.seed = run.seed;
  job.ps_flags = *ModeFlags(run.mode);
  job.ps_flags.push_back("--optimizer=" + absl::GetFlag(FLAGS_optimizer));
  // sync-linear (Goyal et al. 2017): the rate scaled with the workers, reached by a linear
  // warm-up over the first epoch's updates.
  const bool linear = run.mode == "sync-linear";
  job.ps_flags.push_back(absl::StrCat("--lr=", linear ? lr * run.workers : lr));
  if (linear && run.workers > 1) {
    job.ps_flags.push_back(absl::StrCat("--warmup_updates=", 60000 / (run.workers * batch)));
  }
  job.worker_flags = LocalModelFlags(run.mode, lr, 0.9, false);
  if (run.straggler != "none") job.straggler = run.straggler;
  return job;
}

// Every run's configuration, made and checked by the daemons (--dry_run) before any starts.
absl::StatusOr<std::vector<TrainingConfig>> MakeConfigs(const RunMatrix& m,
                                                        const std::vector<ExperimentRun>& runs,
                                                        const std::string& report,
                                                        const std::string& command) {
  std::vector<TrainingConfig> configs;
  for (size_t i = 0; i < runs.size(); ++i) {
    const ExperimentRun& run = runs[i];
    absl::StatusOr<TrainingConfig> c = MakeTrainingConfig(RunJob(m, run));
    if (!c.ok()) return c.status();
    c->run_dir = report + "/" + run.name;
    c->progress_seconds = 10;
    c->progress_prefix = absl::StrFormat("[%d/%d %s] ", i + 1, runs.size(), run.name);
    c->command = command;
    if (absl::Status s = CheckTrainingConfig(*c); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(run.name, ": ", s.message()));
    }
    configs.push_back(*std::move(c));
  }
  return configs;
}

// Runs each configuration in turn until all ran or a shutdown; returns how many failed.
int RunAll(std::vector<ExperimentRun>& runs, const std::vector<TrainingConfig>& configs,
           double target) {
  int failed = 0;
  for (size_t i = 0; i < runs.size() && !ShutdownRequested(); ++i) {
    ExperimentRun& run = runs[i];
    const TrainingConfig& c = configs[i];
    std::cout << c.progress_prefix << "starting: ps " << absl::StrJoin(c.ps_flags, " ")
              << std::endl;
    run.result = RunTraining(c, std::cout);
    if (!run.result.failure.empty()) {
      ++failed;
      std::cout << c.progress_prefix << "FAILED: " << run.result.failure << std::endl;
    }
    SummariseRun(c.run_dir, target, run);
  }
  return failed;
}

// The report's sentence on what every run shared.
std::string Settings(const RunMatrix& m) {
  const JobSpec& job = m.job;
  const std::string model = job.model.empty() ? "MLP " + job.hidden : "model " + job.model;
  return absl::StrCat(
      job.shards, " shards, optimizer ", absl::GetFlag(FLAGS_optimizer), " lr ",
      absl::GetFlag(FLAGS_lr), ", ", model, ", batch ", job.batch_size, " per worker, ",
      m.epochs > 0 ? absl::StrCat(m.epochs, " epochs") : absl::StrCat(job.max_seconds, " s"),
      " per run.");
}

// Prints the report's summary.md; returns main's exit status: 130 after a shutdown, 1 when a run
// failed or the report is missing.
int PrintReport(const std::string& report, size_t runs, int failed) {
  std::ifstream in(report + "/summary.md");
  if (!in && !ShutdownRequested()) {
    return Fail("the report was not written: cannot read " + report + "/summary.md");
  }
  if (in) std::cout << "report: " << report << "/summary.md" << std::endl << in.rdbuf();
  if (ShutdownRequested()) return 130;
  if (failed > 0) {
    return Fail(absl::StrCat(failed, " of ", runs, " runs FAILED (see ", report,
                             "/summary.md and their logs)"));
  }
  return 0;
}

int Main(int argc, char** argv) {
  std::vector<char*> args = ParseFlagsOrHelp(
      argc, argv, "experiment",
      "Runs a matrix of training configurations and writes a report.\n"
      "Example: experiment --preset=straggler   or   experiment --modes=async,sync,ssp:2 "
      "--workers=2,4 --stragglers=none,0:4 --seeds=1,2");
  if (args.size() > 1) return Fail(absl::StrCat("unexpected argument '", args[1], "'"));
  absl::StatusOr<RunMatrix> m = MatrixFromFlags();
  if (!m.ok()) return Fail(std::string(m.status().message()));
  std::string report = absl::GetFlag(FLAGS_report_dir);
  if (report.empty()) {
    report = "reports/" + absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone());
  }
  SetLogTag("experiment");
  InstallShutdownHandler();

  if (m->job.batch_size < 1) return Fail("--batch_size must be positive");
  absl::StatusOr<std::vector<ExperimentRun>> runs = PlanRuns(*m);
  if (!runs.ok()) return Fail(std::string(runs.status().message()));
  if (!(m->job.max_seconds >= 0)) return Fail("--max_seconds must be >= 0");
  if (m->job.max_seconds == 0 && m->epochs == 0) m->job.max_seconds = 60;
  const std::string command = absl::StrJoin(std::vector<std::string>(argv, argv + argc), " ");
  absl::StatusOr<std::vector<TrainingConfig>> configs = MakeConfigs(*m, *runs, report, command);
  if (!configs.ok()) return Fail(std::string(configs.status().message()));
  std::error_code made_report;
  std::filesystem::create_directories(report, made_report);
  if (made_report) {
    return Fail(absl::StrCat("cannot create --report_dir=", report, ": ", made_report.message()));
  }
  const double target = ReferenceAccuracy(m->job.model, absl::GetFlag(FLAGS_target_accuracy),
                                          /*own_networks=*/0.85);
  const int failed = RunAll(*runs, *configs, target);
  if (ShutdownRequested()) {
    while (!runs->empty() && runs->back().result.start_unix_seconds == 0) runs->pop_back();
  }
  WriteReport(report, *runs, target, command, Settings(*m));
  return PrintReport(report, runs->size(), failed);
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
