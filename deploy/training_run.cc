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
      << "\nreplicas: " << c.replicas << "\nworkers: " << c.workers << "\nmodel: " << c.model
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
    if (accuracy >= target && std::isnan(s.target_at)) s.target_at = t;
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

void CommandsFromFlags(JobSpec* job) {
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
  // A worker command checks its own settings when it starts.
  return cluster.CheckFlags(c.shards, c.model, c.workers, ShardFlags(c),
                            c.worker_command.empty()
                                ? std::optional<std::vector<std::string>>(WorkerFlags(c, 0))
                                : std::nullopt);
}

TrainingResult RunTraining(const TrainingConfig& c, std::ostream& progress) {
  TrainingResult result;
  LocalCluster cluster(ExecutableDir(), c.run_dir, c.security);
  const absl::Time start = absl::Now();
  result.start_unix_seconds = absl::ToDoubleSeconds(start - absl::UnixEpoch());
  std::vector<std::string> ps_flags = ShardFlags(c);
  if (absl::Status s = cluster.StartShards(c.shards, c.model, c.workers, ps_flags, c.replicas);
      !s.ok()) {
    result.failure = std::string(s.message());
    return result;
  }
  WriteConfig(c, cluster, start);
  // Worker r's flags; a worker started again gets the time left of the run.
  auto worker_flags = [&](int r) {
    std::vector<std::string> flags = WorkerFlags(c, r);
    if (c.max_seconds > 0) {
      double left = c.max_seconds - absl::ToDoubleSeconds(absl::Now() - start);
      flags.push_back(absl::StrCat("--max_seconds=", std::max(left, 0.1)));  // the last one counts
    }
    return flags;
  };
  if (absl::Status s = cluster.StartEvaluator(c.evaluator_flags, c.evaluator_command); !s.ok()) {
    result.failure = std::string(s.message());
  }
  for (int r = 0; r < c.workers && result.failure.empty(); ++r) {
    if (absl::Status s = cluster.StartWorker(r, c.workers, worker_flags(r), c.worker_command);
        !s.ok()) {
      result.failure = std::string(s.message());
    }
  }

  auto stamp = [&](absl::Time t) {
    return absl::StrFormat("%s[%6.1fs] ", c.progress_prefix, absl::ToDoubleSeconds(t - start));
  };
  // Starts a process that died (exit `code`) again with `start_again`, unless it has been
  // restarted max_restarts times already: then the run ends with the reason.
  std::map<std::string, int> restarts;
  auto recover = [&](const std::string& name, int code, const std::string& how,
                     const std::function<absl::Status()>& start_again) {
    int& n = restarts[name];
    if (n >= c.max_restarts) {
      result.failure = absl::StrCat(name, " exited with status ", code, " again after ", n,
                                    " restart(s); see its log in ", c.run_dir);
      return;
    }
    ++n;
    std::string line = absl::StrCat(name, " exited with status ", code, ": ", how, " (restart ", n,
                                    " of at most ", c.max_restarts, ")");
    progress << stamp(absl::Now()) << line << std::endl;
    if (absl::Status s = start_again(); !s.ok()) {
      result.failure = absl::StrCat("cannot restart ", name, ": ", s.message());
      return;
    }
    result.recoveries.push_back(line);
  };

  int64_t last_steps = 0;
  double last_version = 0;
  absl::Time last_time = start;
  std::vector<Kill> kills = c.kills;  // those not yet done
  // Processes are watched every 200 ms, every 20 ms while a kill waits for progress (a run 5x
  // faster than this machine's does ~1,000 updates in 200 ms); a progress line is printed every
  // progress_seconds.
  while (result.failure.empty()) {
    const bool by_progress = std::any_of(
        kills.begin(), kills.end(), [](const Kill& k) { return k.unit != Kill::Unit::kSeconds; });
    result.interrupted = WaitForShutdown(absl::Milliseconds(by_progress ? 20 : 200));
    absl::Time now = absl::Now();
    if (!kills.empty()) {
      RunProgress at{absl::ToDoubleSeconds(now - start), StepsDone(c.run_dir, c.workers), -1};
      auto read_updates = [&] {
        if (at.updates < 0) at.updates = cluster.UpdatesApplied(absl::Milliseconds(500));
      };
      if (std::any_of(kills.begin(), kills.end(),
                      [](const Kill& k) { return k.unit == Kill::Unit::kUpdates; })) {
        read_updates();
      }
      for (auto k = kills.begin(); k != kills.end();) {
        if (!k->Due(at)) {
          ++k;
          continue;
        }
        read_updates();  // for the progress line
        (k->role == Kill::Role::kWorker ? *cluster.worker(k->index)
                                        : cluster.shards()[k->index * c.replicas])  // replica 0
            .Signal(SIGKILL);
        progress << stamp(now)
                 << absl::StrFormat("killed %s (--kill %s): %d steps, %d updates", k->Name(),
                                    k->When(), at.steps, at.updates)
                 << std::endl;
        k = kills.erase(k);
      }
    }
    bool any_running = false;
    for (int r = 0; r < c.workers && result.failure.empty(); ++r) {
      Subprocess* w = cluster.worker(r);
      if (w->running()) {
        any_running = true;
      } else if (int code = *w->Wait(absl::ZeroDuration()); code != 0) {
        any_running = true;
        recover(absl::StrCat("worker ", r), code, "starting it again (it rejoins and resumes)",
                [&] { return cluster.StartWorker(r, c.workers, worker_flags(r), c.worker_command); });
      }
    }
    for (int i = 0; i < c.shards * c.replicas && result.failure.empty(); ++i) {
      if (cluster.shards()[i].running()) continue;
      int code = *cluster.shards()[i].Wait(absl::ZeroDuration());
      if (c.replicas > 1) {
        recover(absl::StrCat("shard ", i / c.replicas, " replica ", i % c.replicas), code,
                "starting it again (it joins its peer as the backup)",
                [&] { return cluster.RestartShard(i); });
        continue;
      }
      if (c.checkpoint_dir.empty()) {
        result.failure = absl::StrCat("shard ", i, " exited with status ", code,
                                      " and checkpoints are off: the run cannot go on");
        break;
      }
      recover(absl::StrCat("shard ", i), code, "starting it again from its checkpoints",
              [&] { return cluster.RestartShard(i); });
    }
    if (result.failure.empty() && !cluster.evaluator()->running()) {
      int code = *cluster.evaluator()->Wait(absl::ZeroDuration());
      recover("evaluator", code, "starting it again",
              [&] { return cluster.StartEvaluator(c.evaluator_flags, c.evaluator_command); });
    }
    // The evaluator's last row: the version it scored (applied updates) and the accuracy.
    std::string evaluation = LastLine(c.run_dir + "/evaluator.csv");
    double accuracy = CsvField(evaluation, 3);
    if (now - last_time >= absl::Seconds(c.progress_seconds) || result.interrupted ||
        !any_running) {
      int64_t steps = StepsDone(c.run_dir, c.workers);
      // Read from the shards now (the evaluator's last row lags by its interval). A shard that
      // does not answer within 200 ms counts 0, so the line keeps the highest count seen.
      double version =
          static_cast<double>(cluster.UpdatesApplied(absl::Milliseconds(200))) / c.shards;
      version = std::max(version, last_version);
      double dt = absl::ToDoubleSeconds(now - last_time);
      progress << stamp(now)
               << absl::StrFormat("%8d steps (%6.1f/s), %7.0f updates/shard (%6.1f/s), test accuracy %s",
                                  steps, (steps - last_steps) / dt, version,
                                  (version - last_version) / dt,
                                  std::isnan(accuracy) ? "-" : absl::StrFormat("%.4f", accuracy))
               << std::endl;
      last_steps = steps;
      last_version = version;
      last_time = now;
    }
    if (result.interrupted) {
      progress << "interrupted: stopping the cluster" << std::endl;
      break;
    }
    if (c.target_accuracy > 0 && accuracy >= c.target_accuracy) {
      progress << c.progress_prefix << "reached target accuracy " << c.target_accuracy << std::endl;
      break;
    }
    if (!any_running) break;
    // Workers stop themselves at --max_seconds, but one held at a sync barrier may not.
    if (c.max_seconds > 0 && now - start > absl::Seconds(c.max_seconds)) break;
  }
  std::string stop_problems = cluster.Stop();
  if (result.failure.empty() && !result.interrupted) result.failure = stop_problems;
  // A fault that was asked for and never happened makes the run not the experiment asked for.
  if (result.failure.empty() && !result.interrupted && !kills.empty()) {
    result.failure = absl::StrCat("--kill: ", kills[0].Name(), " ", kills[0].When(),
                                  " never happened: the run ended first (at ",
                                  StepsDone(c.run_dir, c.workers), " steps); trigger it earlier");
  }
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  result.worker_steps = StepsDone(c.run_dir, c.workers);
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
    if (furthest) result.shard_stats.push_back(*furthest);
  }
  return result;
}

}  // namespace ps
