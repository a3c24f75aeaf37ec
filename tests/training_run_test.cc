// How launch and experiment describe a job (JobSpec) becomes the daemons' flags.
#include "deploy/training_run.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

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

}  // namespace
}  // namespace ps
