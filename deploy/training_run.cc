#include "deploy/training_run.h"

#include <google/protobuf/util/json_util.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/consistency_spec.h"
#include "common/model_spec.h"
#include "common/network_spec.h"
#include "common/shutdown.h"
#include "deploy/local_cluster.h"

ABSL_FLAG(int, shards, 2, "Parameter-server shards.");
ABSL_FLAG(std::string, hidden, "256,128", "MLP hidden layer sizes.");
ABSL_FLAG(int, batch_size, 64, "Minibatch size per worker.");
ABSL_FLAG(std::string, device, "cpu", "Workers' device: auto | cpu | cuda | cuda:N.");
ABSL_FLAG(int, gpus, 0,
          "Spread the workers over this many GPUs, round robin, one per worker process: each "
          "sees its GPU alone (CUDA_VISIBLE_DEVICES, its cuda:0, LOCAL_RANK=0; the GPUs of this "
          "process's CUDA_VISIBLE_DEVICES when set). 0: the workers see what this process sees.");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist", "Fashion-MNIST IDX files.");
ABSL_FLAG(std::string, worker_flags, "",
          "More flags for every worker, e.g. \"--push_delay=exp:0.01\".");
ABSL_FLAG(std::string, worker_cmd, "",
          "Run this command as each worker instead of the worker daemon (a program and its "
          "arguments, quoted as sh quotes and exec'd; variables through env NAME=value ...; "
          "e.g. \"/usr/bin/python3 examples/pytorch/train.py\"): the flags a worker would get "
          "reach it as PS_NAME=value in its environment (PS_PS, PS_RANK, PS_NUM_WORKERS, PS_CSV, "
          "PS_TOKEN_FILE, PS_STEPS, PS_SLOWDOWN, ...), which paramserver.torch reads.");
ABSL_FLAG(std::string, eval_cmd, "",
          "Run this command as the evaluator instead of the evaluator daemon (e.g. "
          "\"/usr/bin/python3 examples/pytorch/train.py --evaluate\"); needed for a model the "
          "daemon cannot build (a tensor layout). Its flags reach it as --worker_cmd's do.");

namespace ps {
namespace {

// Steps finished by all workers, from the last row of each worker's CSV.
int64_t StepsDone(const std::string& run_dir, int workers) {
  int64_t total = 0;
  for (int r = 0; r < workers; ++r) {
    double step = CsvField(LastLine(absl::StrCat(run_dir, "/worker-", r, ".csv")), 0);
    if (!std::isnan(step)) total += static_cast<int64_t>(step) + 1;
  }
  return total;
}

void WriteConfig(const TrainingConfig& c, const LocalCluster& cluster, absl::Time start) {
  std::ofstream out(c.run_dir + "/config.txt");
  out << "command: " << (c.command.empty() ? "-" : c.command)
      << "\nstarted: " << absl::FormatTime(start) << "\nshards: " << c.shards
      << "\nreplicas: " << c.replicas << "\nworkers: " << c.workers << "\ngpus: " << c.gpus << "\nmodel: " << c.model
      << "\nps addresses: " << cluster.ShardAddresses()
      << "\nps flags: " << absl::StrJoin(c.ps_flags, " ")
      << "\nworker flags: " << absl::StrJoin(c.worker_flags, " ")
      << "\nevaluator flags: " << absl::StrJoin(c.evaluator_flags, " ") << "\n";
  if (!c.worker_command.empty()) out << "worker command: " << c.worker_command << "\n";
  if (!c.evaluator_command.empty()) out << "evaluator command: " << c.evaluator_command << "\n";
  auto or_none = [](const std::string& path) { return path.empty() ? "none" : path; };
  out << "TLS CA: " << or_none(c.security.ca)
      << "\nclient certificate: " << or_none(c.security.client_cert)
      << "\ntoken file: " << or_none(c.security.token_file)
      << "\nread-only token file: " << or_none(c.security.read_token_file)
      << "\nworkers' own tokens: " << (c.security.worker_identity ? "yes" : "no") << "\n";
  for (const auto& [rank, flags] : c.rank_flags) {
    out << "worker " << rank << " extra flags: " << absl::StrJoin(flags, " ") << "\n";
  }
  out << "checkpoints: " << or_none(c.checkpoint_dir) << "\n";
  for (const Kill& k : c.kills) out << "kill " << k.Name() << " " << k.When() << "\n";
}

}  // namespace

double CsvField(const std::string& line, int column) {
  std::vector<std::string> f = absl::StrSplit(line, ',');
  double v = 0;
  return column < static_cast<int>(f.size()) && absl::SimpleAtod(f[column], &v) ? v : NAN;
}

double ReferenceAccuracy(const std::string& model, double target, double own_networks) {
  if (target > 0) return target;
  return IsLayoutSpec(model) ? 0 : own_networks;
}

AccuracySummary SummariseAccuracy(const std::string& csv, double t0, double target) {
  AccuracySummary s;
  std::ifstream in(csv);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    double t = CsvField(line, 0) - t0, accuracy = CsvField(line, 3);
    if (std::isnan(accuracy)) continue;
    s.final_accuracy = accuracy;
    if (!(s.best >= accuracy)) {
      s.best = accuracy;
      s.best_at = t;
    }
    if (target > 0 && accuracy >= target && std::isnan(s.target_at)) s.target_at = t;
  }
  return s;
}

std::vector<std::string> LocalModelFlags(const std::string& consistency, double lr, double momentum,
                                         bool cosine) {
  absl::StatusOr<ConsistencySpec> spec = ParseConsistencySpec(consistency);
  if (!spec.ok() || !spec->local_models()) return {};
  std::vector<std::string> flags = {absl::StrCat("--local_lr=", lr),
                                    absl::StrCat("--local_momentum=", momentum)};
  if (cosine) flags.push_back("--local_lr_schedule=cosine");
  return flags;
}

void JobFromSharedFlags(JobSpec* job) {
  job->shards = absl::GetFlag(FLAGS_shards);
  job->hidden = absl::GetFlag(FLAGS_hidden);
  job->batch_size = absl::GetFlag(FLAGS_batch_size);
  job->device = absl::GetFlag(FLAGS_device);
  job->gpus = absl::GetFlag(FLAGS_gpus);
  job->data_dir = absl::GetFlag(FLAGS_data_dir);
  job->extra_worker_flags = absl::GetFlag(FLAGS_worker_flags);
  job->worker_command = absl::GetFlag(FLAGS_worker_cmd);
  job->evaluator_command = absl::GetFlag(FLAGS_eval_cmd);
}

namespace {

// A worker or evaluator command is exec'd by sh (so that its signals and exit status are the
// program's own): one program and its arguments, quoted as sh quotes.
absl::Status CheckCommand(const std::string& flag, const std::string& command) {
  const std::vector<std::string> words = absl::StrSplit(command, ' ', absl::SkipWhitespace());
  if (!words.empty() && words[0].find('=') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": '", words[0], "' is not a program; set variables with env: \"env ", words[0],
        " ...\""));
  }
  for (const char* op : {"&&", "||", ";", "|"}) {
    if (command.find(op) != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, " is one program and its arguments (it is exec'd), not a shell list ('", op,
          "'): put the steps in a script"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainingConfig> MakeTrainingConfig(const JobSpec& job) {
  if (job.shards < 1 || job.workers < 1) {
    return absl::InvalidArgumentError("shards and workers must be positive");
  }
  if (job.gpus < 0) return absl::InvalidArgumentError("--gpus must be 0 (none) or more");
  if (absl::Status s = CheckCommand("--worker_cmd", job.worker_command); !s.ok()) return s;
  if (absl::Status s = CheckCommand("--eval_cmd", job.evaluator_command); !s.ok()) return s;
  absl::StatusOr<std::string> model = ResolveModelSpec(job.model, job.hidden);
  if (!model.ok()) return model.status();
  // The daemons build networks for Fashion-MNIST; a worker or evaluator command is the judge of
  // its own model.
  absl::StatusOr<NetworkSpec> network = ResolveModel(*model, "");
  if (network.ok() && (job.worker_command.empty() || job.evaluator_command.empty())) {
    if (absl::Status s = network->FitsFashionMnist(); !s.ok()) return s;
  }
  if (!network.ok() && job.worker_command.empty()) {
    return IsLayoutSpec(*model) ? absl::InvalidArgumentError(
                                      "a tensor layout model is trained by the user's workers: "
                                      "give --worker_cmd (e.g. a Python worker)")
                                : network.status();
  }
  if (!network.ok() && job.evaluator_command.empty()) {
    return absl::InvalidArgumentError(
        "the evaluator daemon scores mlp: and cnn: networks only: give --eval_cmd (the "
        "user's own scoring code, e.g. examples/pytorch/train.py --evaluate)");
  }
  TrainingConfig c;
  c.shards = job.shards;
  c.workers = job.workers;
  c.gpus = job.gpus;
  c.model = *std::move(model);
  c.worker_command = job.worker_command;
  c.evaluator_command = job.evaluator_command;
  c.max_seconds = job.max_seconds;
  c.ps_flags = job.ps_flags;
  for (absl::string_view w : absl::StrSplit(job.extra_ps_flags, ' ', absl::SkipWhitespace())) {
    c.ps_flags.emplace_back(w);
  }
  const std::string hidden = job.model.empty() ? "--hidden=" + job.hidden : "--model=" + c.model;
  const std::string data = "--data_dir=" + job.data_dir;
  c.worker_flags = {hidden,
                    data,
                    absl::StrCat("--batch_size=", job.batch_size),
                    absl::StrCat("--steps=", job.steps),
                    absl::StrCat("--max_seconds=", job.max_seconds),
                    absl::StrCat("--seed=", job.seed),
                    "--device=" + job.device,
                    "--threads=1"};
  c.worker_flags.insert(c.worker_flags.end(), job.worker_flags.begin(), job.worker_flags.end());
  for (absl::string_view w : absl::StrSplit(job.extra_worker_flags, ' ', absl::SkipWhitespace())) {
    c.worker_flags.emplace_back(w);
  }
  c.evaluator_flags = {hidden, data, "--device=" + job.device,
                       absl::StrCat("--interval_seconds=", job.eval_interval_seconds)};
  if (!job.straggler.empty()) {
    std::vector<std::string> parts = absl::StrSplit(job.straggler, ':');
    int rank = -1;
    double factor = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &rank) ||
        !absl::SimpleAtod(parts[1], &factor) || rank < 0 || rank >= job.workers || !(factor >= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad straggler '", job.straggler,
                       "': expected RANK:FACTOR with 0 <= RANK < workers and FACTOR >= 1"));
    }
    c.rank_flags[rank] = {absl::StrCat("--slowdown=", factor)};
  }
  return c;
}

namespace {

// The flags of the config's shards, and of worker `rank` (without the time left of the run).
std::vector<std::string> ShardFlags(const TrainingConfig& c) {
  std::vector<std::string> flags = c.ps_flags;
  if (!c.checkpoint_dir.empty()) flags.push_back("--checkpoint_dir=" + c.checkpoint_dir);
  return flags;
}
std::vector<std::string> WorkerFlags(const TrainingConfig& c, int rank) {
  std::vector<std::string> flags = c.worker_flags;
  if (auto it = c.rank_flags.find(rank); it != c.rank_flags.end()) {
    flags.insert(flags.end(), it->second.begin(), it->second.end());
  }
  return flags;
}

}  // namespace

absl::Status CheckTrainingConfig(const TrainingConfig& c) {
  LocalCluster cluster(ExecutableDir(), c.run_dir, c.security);
  if (absl::Status s = cluster.UseGpus(c.gpus); !s.ok()) return s;
  // A worker command checks its own settings when it starts.
  return cluster.CheckFlags(c.shards, c.model, c.workers, ShardFlags(c),
                            c.worker_command.empty()
                                ? std::optional<std::vector<std::string>>(WorkerFlags(c, 0))
                                : std::nullopt);
}

namespace {

// The stats each shard wrote at shutdown; of a replicated shard, the replica that ended furthest
// on. Shards without a readable file are left out.
std::vector<v1::StatsResponse> ShardStats(const TrainingConfig& c) {
  std::vector<v1::StatsResponse> all;
  for (int s = 0; s < c.shards; ++s) {
    std::optional<v1::StatsResponse> furthest;
    for (int r = 0; r < c.replicas; ++r) {
      std::ifstream in(absl::StrCat(c.run_dir, "/stats-shard-", s,
                                    c.replicas > 1 ? absl::StrCat("-", r) : "", ".json"));
      std::stringstream json;
      json << in.rdbuf();
      v1::StatsResponse stats;
      if (google::protobuf::util::JsonStringToMessage(json.str(), &stats).ok() &&
          (!furthest || stats.version() > furthest->version())) {
        furthest = stats;
      }
    }
    if (furthest) all.push_back(*furthest);
  }
  return all;
}

// One run of RunTraining: starts the cluster, watches it (restarts, kills, progress lines) until
// it ends, stops it and collects the result.
class ClusterRun {
 public:
  ClusterRun(const TrainingConfig& c, std::ostream& progress)
      : c_(c),
        progress_(progress),
        cluster_(ExecutableDir(), c.run_dir, c.security),
        start_(absl::Now()),
        kills_(c.kills),
        last_time_(start_) {
    result_.start_unix_seconds = absl::ToDoubleSeconds(start_ - absl::UnixEpoch());
  }

  TrainingResult Run() {
    if (absl::Status s = cluster_.UseGpus(c_.gpus); !s.ok()) {
      result_.failure = std::string(s.message());
      return result_;
    }
    if (absl::Status s =
            cluster_.StartShards(c_.shards, c_.model, c_.workers, ShardFlags(c_), c_.replicas);
        !s.ok()) {
      result_.failure = std::string(s.message());
      return result_;
    }
    WriteConfig(c_, cluster_, start_);
    if (absl::Status s = cluster_.StartEvaluator(c_.evaluator_flags, c_.evaluator_command);
        !s.ok()) {
      result_.failure = std::string(s.message());
    }
    for (int r = 0; r < c_.workers && result_.failure.empty(); ++r) {
      if (absl::Status s = StartWorker(r); !s.ok()) result_.failure = std::string(s.message());
    }
    Supervise();
    Finish();
    return result_;
  }

 private:
  // Watches the processes every 200 ms, every 20 ms while a kill waits for progress (a run 5x
  // faster than this machine's does ~1,000 updates in 200 ms), and prints a progress line every
  // progress_seconds, until the run ends or fails.
  void Supervise() {
    while (result_.failure.empty()) {
      const bool by_progress = std::any_of(kills_.begin(), kills_.end(), [](const Kill& k) {
        return k.unit != Kill::Unit::kSeconds;
      });
      result_.interrupted = WaitForShutdown(absl::Milliseconds(by_progress ? 20 : 200));
      const absl::Time now = absl::Now();
      if (!kills_.empty()) InjectKills(now);
      const bool any_running = WatchWorkers();
      WatchShards();
      WatchEvaluator();
      // The evaluator's last row: the version it scored (applied updates) and the accuracy.
      const double accuracy = CsvField(LastLine(c_.run_dir + "/evaluator.csv"), 3);
      if (now - last_time_ >= absl::Seconds(c_.progress_seconds) || result_.interrupted ||
          !any_running) {
        PrintProgress(now, accuracy);
      }
      if (Ended(now, accuracy, any_running)) break;
    }
  }

  // Whether the run is over: interrupted, the target accuracy reached, no worker left, or out of
  // time.
  bool Ended(absl::Time now, double accuracy, bool any_running) {
    if (result_.interrupted) {
      progress_ << "interrupted: stopping the cluster" << std::endl;
      return true;
    }
    if (c_.target_accuracy > 0 && accuracy >= c_.target_accuracy) {
      progress_ << c_.progress_prefix << "reached target accuracy " << c_.target_accuracy
                << std::endl;
      return true;
    }
    if (!any_running) return true;
    // Workers stop themselves at --max_seconds, but one held at a sync barrier may not.
    return c_.max_seconds > 0 && now - start_ > absl::Seconds(c_.max_seconds);
  }

  // Stops the cluster and collects what the run left behind.
  void Finish() {
    std::string stop_problems = cluster_.Stop();
    if (result_.failure.empty() && !result_.interrupted) result_.failure = stop_problems;
    // A fault that was asked for and never happened makes the run not the experiment asked for.
    if (result_.failure.empty() && !result_.interrupted && !kills_.empty()) {
      result_.failure =
          absl::StrCat("--kill: ", kills_[0].Name(), " ", kills_[0].When(),
                       " never happened: the run ended first (at ",
                       StepsDone(c_.run_dir, c_.workers), " steps); trigger it earlier");
    }
    result_.seconds = absl::ToDoubleSeconds(absl::Now() - start_);
    result_.worker_steps = StepsDone(c_.run_dir, c_.workers);
    result_.shard_stats = ShardStats(c_);
  }

  // Worker r, started with the time left of the run.
  absl::Status StartWorker(int r) {
    std::vector<std::string> flags = WorkerFlags(c_, r);
    if (c_.max_seconds > 0) {
      double left = c_.max_seconds - absl::ToDoubleSeconds(absl::Now() - start_);
      flags.push_back(absl::StrCat("--max_seconds=", std::max(left, 0.1)));  // the last one counts
    }
    return cluster_.StartWorker(r, c_.workers, flags, c_.worker_command);
  }

  // Kills the processes whose kill is due (SIGKILL), each with a progress line.
  void InjectKills(absl::Time now) {
    RunProgress at{absl::ToDoubleSeconds(now - start_), StepsDone(c_.run_dir, c_.workers), -1};
    auto read_updates = [&] {
      if (at.updates < 0) at.updates = cluster_.UpdatesApplied(absl::Milliseconds(500));
    };
    if (std::any_of(kills_.begin(), kills_.end(),
                    [](const Kill& k) { return k.unit == Kill::Unit::kUpdates; })) {
      read_updates();
    }
    for (auto k = kills_.begin(); k != kills_.end();) {
      if (!k->Due(at)) {
        ++k;
        continue;
      }
      read_updates();  // for the progress line
      (k->role == Kill::Role::kWorker ? *cluster_.worker(k->index)
                                      : cluster_.shards()[k->index * c_.replicas])  // replica 0
          .Signal(SIGKILL);
      progress_ << Stamp(now)
                << absl::StrFormat("killed %s (--kill %s): %d steps, %d updates", k->Name(),
                                   k->When(), at.steps, at.updates)
                << std::endl;
      k = kills_.erase(k);
    }
  }

  // Restarts the workers that failed; returns whether any worker is running (or restarted).
  bool WatchWorkers() {
    bool any_running = false;
    for (int r = 0; r < c_.workers && result_.failure.empty(); ++r) {
      Subprocess* w = cluster_.worker(r);
      if (w->running()) {
        any_running = true;
      } else if (int code = *w->Wait(absl::ZeroDuration()); code != 0) {
        any_running = true;
        Recover(absl::StrCat("worker ", r), code, "starting it again (it rejoins and resumes)",
                [&] { return StartWorker(r); });
      }
    }
    return any_running;
  }

  // Restarts the shards that died: a replica joins its peer, a shard with checkpoints resumes
  // from them; without either the run fails.
  void WatchShards() {
    for (int i = 0; i < c_.shards * c_.replicas && result_.failure.empty(); ++i) {
      if (cluster_.shards()[i].running()) continue;
      int code = *cluster_.shards()[i].Wait(absl::ZeroDuration());
      if (c_.replicas > 1) {
        Recover(absl::StrCat("shard ", i / c_.replicas, " replica ", i % c_.replicas), code,
                "starting it again (it joins its peer as the backup)",
                [&] { return cluster_.RestartShard(i); });
        continue;
      }
      if (c_.checkpoint_dir.empty()) {
        result_.failure = absl::StrCat("shard ", i, " exited with status ", code,
                                       " and checkpoints are off: the run cannot go on");
        return;
      }
      Recover(absl::StrCat("shard ", i), code, "starting it again from its checkpoints",
              [&] { return cluster_.RestartShard(i); });
    }
  }

  void WatchEvaluator() {
    if (!result_.failure.empty() || cluster_.evaluator()->running()) return;
    int code = *cluster_.evaluator()->Wait(absl::ZeroDuration());
    Recover("evaluator", code, "starting it again",
            [&] { return cluster_.StartEvaluator(c_.evaluator_flags, c_.evaluator_command); });
  }

  // Starts a process that died (exit `code`) again with `start_again`, unless it has been
  // restarted max_restarts times already: then the run ends with the reason.
  void Recover(const std::string& name, int code, const std::string& how,
               const std::function<absl::Status()>& start_again) {
    int& n = restarts_[name];
    if (n >= c_.max_restarts) {
      result_.failure = absl::StrCat(name, " exited with status ", code, " again after ", n,
                                     " restart(s); see its log in ", c_.run_dir);
      return;
    }
    ++n;
    std::string line = absl::StrCat(name, " exited with status ", code, ": ", how, " (restart ", n,
                                    " of at most ", c_.max_restarts, ")");
    progress_ << Stamp(absl::Now()) << line << std::endl;
    if (absl::Status s = start_again(); !s.ok()) {
      result_.failure = absl::StrCat("cannot restart ", name, ": ", s.message());
      return;
    }
    result_.recoveries.push_back(line);
  }

  // The progress line: steps and updates since the last one, and the evaluator's last accuracy.
  void PrintProgress(absl::Time now, double accuracy) {
    int64_t steps = StepsDone(c_.run_dir, c_.workers);
    // Read from the shards now (the evaluator's last row lags by its interval). A shard that
    // does not answer within 200 ms counts 0, so the line keeps the highest count seen.
    double version =
        static_cast<double>(cluster_.UpdatesApplied(absl::Milliseconds(200))) / c_.shards;
    version = std::max(version, last_version_);
    double dt = absl::ToDoubleSeconds(now - last_time_);
    progress_ << Stamp(now)
              << absl::StrFormat(
                     "%8d steps (%6.1f/s), %7.0f updates/shard (%6.1f/s), test accuracy %s", steps,
                     (steps - last_steps_) / dt, version, (version - last_version_) / dt,
                     std::isnan(accuracy) ? "-" : absl::StrFormat("%.4f", accuracy))
              << std::endl;
    last_steps_ = steps;
    last_version_ = version;
    last_time_ = now;
  }

  // "[prefix][  12.3s] ": the time since the start, before each line.
  std::string Stamp(absl::Time t) const {
    return absl::StrFormat("%s[%6.1fs] ", c_.progress_prefix, absl::ToDoubleSeconds(t - start_));
  }

  const TrainingConfig& c_;
  std::ostream& progress_;
  LocalCluster cluster_;
  const absl::Time start_;
  TrainingResult result_;
  std::vector<Kill> kills_;              // those not yet done
  std::map<std::string, int> restarts_;  // per process name
  // At the last progress line.
  int64_t last_steps_ = 0;
  double last_version_ = 0;
  absl::Time last_time_;
};

}  // namespace

TrainingResult RunTraining(const TrainingConfig& c, std::ostream& progress) {
  return ClusterRun(c, progress).Run();
}

}  // namespace ps
