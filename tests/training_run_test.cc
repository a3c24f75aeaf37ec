// How launch and experiment describe a job (JobSpec) becomes the daemons' flags and the GPU each
// worker sees; launch --kill's plan and when each death is due.
#include "deploy/training_run.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "tests/run_dir.h"
#include "tests/scoped_env.h"

namespace ps {
namespace {

bool Has(const std::vector<std::string>& flags, const std::string& flag) {
  return std::find(flags.begin(), flags.end(), flag) != flags.end();
}

TEST(TrainingRunTest, AJobSpecBecomesTheDaemonsFlags) {
  JobSpec job;
  job.workers = 3;
  job.hidden = "32,16";
  job.device = "cuda";
  job.data_dir = "/data/fm";
  job.ps_flags = {"--consistency=sync"};
  job.extra_ps_flags = " --lr_schedule=cosine  --max_staleness=4 ";
  job.extra_worker_flags = "--prefetch";
  job.straggler = "2:4";
  absl::StatusOr<TrainingConfig> c = MakeTrainingConfig(job);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model, "mlp:784-32-16-10");
  EXPECT_EQ(c->workers, 3);
  EXPECT_EQ(c->ps_flags, (std::vector<std::string>{"--consistency=sync", "--lr_schedule=cosine",
                                                   "--max_staleness=4"}));
  for (const char* f : {"--hidden=32,16", "--data_dir=/data/fm", "--device=cuda", "--prefetch"}) {
    EXPECT_TRUE(Has(c->worker_flags, f)) << f;
  }
  EXPECT_EQ(c->worker_flags.back(), "--prefetch");  // the caller's flags come last: they win
  EXPECT_TRUE(Has(c->evaluator_flags, "--hidden=32,16"));
  EXPECT_TRUE(Has(c->evaluator_flags, "--data_dir=/data/fm"));
  EXPECT_TRUE(Has(c->evaluator_flags, "--device=cuda"));  // the evaluator follows the workers
  ASSERT_EQ(c->rank_flags.count(2), 1u);
  EXPECT_EQ(c->rank_flags.at(2), (std::vector<std::string>{"--slowdown=4"}));
}

TEST(TrainingRunTest, BadJobSpecsAreRefusedWithAReason) {
  for (const char* straggler : {"3:2", "-1:2", "1:0.5", "1", "x:2", "1:2:3"}) {
    JobSpec job;
    job.workers = 3;
    job.straggler = straggler;
    absl::StatusOr<TrainingConfig> c = MakeTrainingConfig(job);
    ASSERT_FALSE(c.ok()) << straggler;
    EXPECT_NE(std::string(c.status().message()).find("RANK:FACTOR"), std::string::npos);
  }
  JobSpec bad_model;
  bad_model.hidden = "32,x";
  EXPECT_FALSE(MakeTrainingConfig(bad_model).ok());
  JobSpec no_workers;
  no_workers.workers = 0;
  EXPECT_FALSE(MakeTrainingConfig(no_workers).ok());
}

// The user's worker and evaluator commands train and score what the daemons cannot build: a
// tensor layout needs both; the shards get the layout inline.
TEST(TrainingRunTest, ALayoutModelRunsWithTheUsersCommands) {
  JobSpec job;
  job.model = R"({"tensors": [{"name": "fc.weight", "shape": [10, 784]}]})";
  EXPECT_NE(MakeTrainingConfig(job).status().message().find("give --worker_cmd"),
            std::string::npos);
  job.worker_command = "/usr/bin/python3 train.py";
  EXPECT_NE(MakeTrainingConfig(job).status().message().find("give --eval_cmd"),
            std::string::npos);
  job.evaluator_command = "/usr/bin/python3 train.py --evaluate";
  absl::StatusOr<TrainingConfig> c = MakeTrainingConfig(job);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model, R"({"tensors":[{"name":"fc.weight","shape":[10,784]}]})");
  EXPECT_EQ(c->worker_command, job.worker_command);
  EXPECT_EQ(c->evaluator_command, job.evaluator_command);
  EXPECT_TRUE(Has(c->worker_flags, "--model=" + c->model));
  // A network with a worker command keeps the evaluator daemon unless told otherwise.
  JobSpec mlp;
  mlp.hidden = "32";
  mlp.worker_command = "/usr/bin/python3 train.py --arch=mlp:32";
  c = MakeTrainingConfig(mlp);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model, "mlp:784-32-10");
  EXPECT_TRUE(c->evaluator_command.empty());
  // A command is exec'd: one program, not a shell list or an assignment.
  for (auto [command, says] : std::vector<std::pair<std::string, std::string>>{
           {"OMP_NUM_THREADS=1 python3 t.py", "set variables with env"},
           {"cd x && python3 t.py", "not a shell list ('&&')"},
           {"python3 t.py | tee log", "not a shell list ('|')"}}) {
    mlp.worker_command = command;
    EXPECT_NE(MakeTrainingConfig(mlp).status().message().find(says), std::string::npos)
        << command << ": " << MakeTrainingConfig(mlp).status();
  }
}

// A run is measured against the job's own target; without one, this project's networks
// (Fashion-MNIST) against a default, and a tensor layout (a user's model) against nothing.
TEST(TrainingRunTest, ALayoutModelHasNoReferenceAccuracyButTheJobsTarget) {
  const std::string layout = R"({"tensors":[{"name":"fc.weight","shape":[10,784]}]})";
  EXPECT_EQ(ReferenceAccuracy(layout, 0, 0.8833), 0);
  EXPECT_EQ(ReferenceAccuracy("model.json", 0, 0.8833), 0);
  EXPECT_EQ(ReferenceAccuracy(layout, 0.6, 0.8833), 0.6);
  EXPECT_EQ(ReferenceAccuracy("mlp:784-32-10", 0, 0.8833), 0.8833);
  EXPECT_EQ(ReferenceAccuracy("cnn-small", 0, 0.85), 0.85);
  EXPECT_EQ(ReferenceAccuracy("mlp:784-32-10", 0.9, 0.8833), 0.9);
  // No reference: no time to it, whatever the accuracy.
  const std::string csv = ::testing::TempDir() + "/evaluator.csv";
  std::ofstream(csv) << "wall_time,version,test_loss,test_accuracy\n100,5,0.9,0.41\n"
                        "102,9,0.7,0.62\n";
  EXPECT_TRUE(std::isnan(SummariseAccuracy(csv, 100, 0).target_at));
  EXPECT_EQ(SummariseAccuracy(csv, 100, 0).final_accuracy, 0.62);
  EXPECT_EQ(SummariseAccuracy(csv, 100, 0.6).target_at, 2);
}

// The variable `name` as worker `rank` of `cluster` (running `env`) saw it; "" if unset.
std::string SeenByWorker(LocalCluster& cluster, int rank, const std::string& name) {
  std::string log = ReadFile(cluster.run_dir() + "/worker-" + std::to_string(rank) + ".log");
  size_t at = log.find("\n" + name + "=");
  if (at == std::string::npos) return "";
  at += name.size() + 2;
  return log.substr(at, log.find('\n', at) - at);
}

TEST(TrainingRunTest, EachWorkerSeesOneGpuRoundRobin) {
  JobSpec job;
  job.gpus = 2;
  absl::StatusOr<TrainingConfig> c = MakeTrainingConfig(job);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gpus, 2);
  job.gpus = -1;
  EXPECT_FALSE(MakeTrainingConfig(job).ok());

  // Without CUDA_VISIBLE_DEVICES the GPUs are 0..N-1; with it, its first N entries.
  for (const char* visible : {"", "5,7,9"}) {
    ScopedEnv env("CUDA_VISIBLE_DEVICES", visible);
    if (*visible == '\0') unsetenv("CUDA_VISIBLE_DEVICES");
    LocalCluster cluster(ExecutableDir(), NewRunDir("gpus"));
    ASSERT_TRUE(cluster.UseGpus(2).ok());
    for (int r = 0; r < 3; ++r) ASSERT_TRUE(cluster.StartWorker(r, 3, {}, "/usr/bin/env").ok());
    for (int r = 0; r < 3; ++r) ASSERT_EQ(cluster.worker(r)->Wait(absl::Minutes(1)).value(), 0);
    const std::vector<std::string> expected =
        *visible == '\0' ? std::vector<std::string>{"0", "1", "0"}
                         : std::vector<std::string>{"5", "7", "5"};
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(SeenByWorker(cluster, r, "CUDA_VISIBLE_DEVICES"), expected[r]) << r;
      EXPECT_EQ(SeenByWorker(cluster, r, "LOCAL_RANK"), "0") << r;
      EXPECT_EQ(SeenByWorker(cluster, r, "PS_RANK"), std::to_string(r)) << r;
    }
  }
  ScopedEnv two("CUDA_VISIBLE_DEVICES", "5,7");
  LocalCluster cluster(ExecutableDir(), NewRunDir("gpus"));
  absl::Status three = cluster.UseGpus(3);
  EXPECT_NE(three.message().find("CUDA_VISIBLE_DEVICES=5,7 lists 2"), absl::string_view::npos)
      << three;
  EXPECT_FALSE(cluster.UseGpus(-1).ok());
}

TEST(TrainingRunTest, WorkersSeeTheLaunchersGpusWithoutGpus) {
  ScopedEnv visible("CUDA_VISIBLE_DEVICES", "3");
  ScopedEnv local("LOCAL_RANK", "2");
  LocalCluster cluster(ExecutableDir(), NewRunDir("gpus"));
  ASSERT_TRUE(cluster.StartWorker(0, 1, {}, "/usr/bin/env").ok());
  ASSERT_EQ(cluster.worker(0)->Wait(absl::Minutes(1)).value(), 0);
  EXPECT_EQ(SeenByWorker(cluster, 0, "CUDA_VISIBLE_DEVICES"), "3");
  EXPECT_EQ(SeenByWorker(cluster, 0, "LOCAL_RANK"), "2");
}

TEST(KillPlanTest, TriggersByTimeStepsOrUpdatesInTheOrderGiven) {
  absl::StatusOr<std::vector<Kill>> plan =
      ParseKillPlan("ps:1@800u, worker:2@300steps,worker:0@6s,ps:0@7,worker:1@50updates", 2, 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 5u);
  const Kill& shard = (*plan)[0];
  EXPECT_EQ(shard.role, Kill::Role::kShard);
  EXPECT_EQ(shard.index, 1);
  EXPECT_EQ(shard.unit, Kill::Unit::kUpdates);
  EXPECT_EQ(shard.Name() + " " + shard.When(), "shard 1 after 800 updates");
  EXPECT_EQ((*plan)[1].Name() + " " + (*plan)[1].When(), "worker 2 after 300 steps");
  EXPECT_EQ((*plan)[2].When(), "at 6 s");
  EXPECT_EQ((*plan)[3].When(), "at 7 s");
  EXPECT_EQ((*plan)[4].When(), "after 50 updates");

  // Each trigger looks at its own measure of progress only.
  EXPECT_FALSE(shard.Due({/*seconds=*/1e6, /*steps=*/1'000'000, /*updates=*/799}));
  EXPECT_TRUE(shard.Due({0, 0, 800}));
  EXPECT_FALSE((*plan)[1].Due({1e6, 299, 1'000'000}));
  EXPECT_TRUE((*plan)[1].Due({0, 300, 0}));
  EXPECT_FALSE((*plan)[2].Due({5.9, 1'000'000, 1'000'000}));
  EXPECT_TRUE((*plan)[2].Due({6, 0, 0}));
}

TEST(KillPlanTest, BadItemsAreRefusedWithTheReason) {
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"worker:3@1s", "no worker 3"},
           {"ps:2@10u", "no shard 2"},
           {"ps:-1@10u", "no shard -1"},
           {"evaluator:0@1s", "neither worker nor ps"},
           {"worker@1s", "no ':'"},
           {"worker:1", "no '@'"},
           {"worker:x@1s", "the index is not a number"},
           {"worker:1@-5steps", "not a number >= 0"},
           {"worker:1@5min", "not a number >= 0"},
           {"worker:1@steps", "not a number >= 0"},
           {"worker:1@infs", "not a number >= 0"},
       }) {
    absl::StatusOr<std::vector<Kill>> plan = ParseKillPlan(text, 2, 3);
    ASSERT_FALSE(plan.ok()) << text;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(plan.status().message().find(why), std::string::npos) << plan.status();
    EXPECT_NE(plan.status().message().find("'" + text + "'"), std::string::npos) << plan.status();
  }
  EXPECT_TRUE(ParseKillPlan("", 1, 1)->empty());
}

}  // namespace
}  // namespace ps
