// Export (issue 8, item 5): a trained job's model written from its checkpoints and from its live
// shards under the model's own tensor names, scored offline by `evaluator --model_file` and by
// NumPy alone (tools/score_model.py) to the same accuracy; checkpoints that are missing, corrupt,
// of another model or of different jobs, and bad flags, refused with a reason.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "common/model_spec.h"
#include "common/partition.h"
#include "deploy/local_cluster.h"
#include "server/checkpoints/checkpoint_store.h"
#include "tests/run_dir.h"
#include "tools/model_export.h"
#include "trainer/model_file.h"
#include "trainer/network.h"

namespace ps {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

struct Finished {
  int code = -1;
  std::string output;  // stdout and stderr
  double seconds = 0;
};

// Runs a program to completion; argv[0] "export_model" or "evaluator" is taken from the test's
// own directory.
Finished RunProgram(std::vector<std::string> argv) {
  if (argv[0].find('/') == std::string::npos) argv[0] = ExecutableDir() + "/" + argv[0];
  const std::string log = NewRunDir("export") + "/out.log";
  Finished run;
  const absl::Time start = absl::Now();
  absl::StatusOr<Subprocess> p = Subprocess::Start(argv, log);
  EXPECT_TRUE(p.ok()) << p.status();
  absl::StatusOr<int> code = p.ok() ? p->Wait(absl::Minutes(3)) : p.status();
  EXPECT_TRUE(code.ok()) << code.status();
  run.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  run.code = code.ok() ? *code : -1;
  run.output = ReadFile(log);
  return run;
}

struct Score {
  double loss = -1;
  double accuracy = -1;
};

// The "test loss L, accuracy A" that evaluator --model_file and score_model.py both print.
Score ParseScore(const std::string& output) {
  Score s;
  size_t at = output.find("test loss ");
  if (at != std::string::npos) {
    std::sscanf(output.c_str() + at, "test loss %lf, accuracy %lf", &s.loss, &s.accuracy);
  }
  return s;
}

// Each shard's newest checkpoint file in `dir`, read as the shard wrote it: the values in shard
// order, and the versions.
std::vector<float> NewestCheckpointValues(const std::string& dir, int num_shards,
                                          std::vector<int64_t>* versions) {
  std::vector<float> values;
  for (int shard = 0; shard < num_shards; ++shard) {
    const std::string prefix = "shard-" + std::to_string(shard) + "-";
    std::string newest;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      std::string name = entry.path().filename().string();
      if (name.rfind(prefix, 0) == 0 && name > newest) newest = name;
    }
    absl::StatusOr<ShardState> c = ReadShardState(dir + "/" + newest);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return {};
    const std::vector<float>& shard_values = *c->Find(kValuesTensor);
    values.insert(values.end(), shard_values.begin(), shard_values.end());
    versions->push_back(c->header.version());
  }
  return values;
}

TEST(ExportTest, ATrainedJobExportsFromCheckpointsAndLiveShardsAndNumPyScoresItAsTheEvaluator) {
  const std::string dir = NewRunDir("export"), checkpoints = dir + "/checkpoints";
  const std::string model = "mlp:784-256-128-10";  // the tools' default --hidden=256,128
  const std::string live_file = dir + "/live.safetensors", file = dir + "/model.safetensors";
  LocalCluster cluster(ExecutableDir(), dir);
  ASSERT_TRUE(
      cluster
          .StartShards(2, model, 2, {"--checkpoint_dir=" + checkpoints, "--checkpoint_updates=100"})
          .ok());
  const std::string ps = "--ps=" + cluster.ShardAddresses();
  Finished early = RunProgram({"export_model", ps, "--out=" + live_file});
  EXPECT_EQ(early.code, 1);
  EXPECT_NE(early.output.find("is not initialised yet: nothing to export"), std::string::npos)
      << early.output;
  for (int rank = 0; rank < 2; ++rank)
    ASSERT_TRUE(cluster.StartWorker(rank, 2, {"--steps=200"}).ok());
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(*cluster.worker(rank)->Wait(absl::Minutes(3)), 0)
        << ReadFile(dir + "/worker-" + std::to_string(rank) + ".log");
  }
  Finished live = RunProgram({"export_model", ps, "--out=" + live_file});
  ASSERT_EQ(live.code, 0) << live.output;
  Finished other_model = RunProgram({"export_model", ps, "--hidden=64", "--out=" + live_file});
  EXPECT_EQ(other_model.code, 1);
  EXPECT_NE(other_model.output.find("mlp:784-64-10"), std::string::npos) << other_model.output;
  EXPECT_EQ(cluster.Stop(), "");  // SIGTERM: each shard writes its last checkpoint

  Finished offline =
      RunProgram({"export_model", "--checkpoint_dir=" + checkpoints, "--out=" + file});
  ASSERT_EQ(offline.code, 0) << offline.output;
  std::cout << "live: " << live.output << "checkpoints: " << offline.output;
  // The export from the checkpoints is their values, bit for bit; the workers had finished, so
  // the live shards served the same.
  std::vector<int64_t> versions;
  const std::vector<float> values = NewestCheckpointValues(checkpoints, 2, &versions);
  EXPECT_EQ(versions, (std::vector<int64_t>{400, 400}));
  for (const std::string& path : {file, live_file}) {
    absl::StatusOr<ModelFile> exported = ReadModelFile(path, model);
    ASSERT_TRUE(exported.ok()) << exported.status();
    EXPECT_EQ(exported->versions, versions) << path;
    ASSERT_EQ(exported->params.size(), values.size()) << path;
    EXPECT_EQ(std::memcmp(exported->params.data(), values.data(), values.size() * sizeof(float)), 0)
        << path;
  }

  const std::string csv = dir + "/eval.csv";
  Finished evaluator = RunProgram({"evaluator", "--model_file=" + file, "--csv=" + csv});
  ASSERT_EQ(evaluator.code, 0) << evaluator.output;
  Finished numpy =
      RunProgram({PS_PYTHON, std::string(PS_SOURCE_DIR) + "/tools/score_model.py", file});
  ASSERT_EQ(numpy.code, 0) << numpy.output;
  std::cout << "evaluator (" << evaluator.seconds << " s): " << evaluator.output << "numpy ("
            << numpy.seconds << " s): " << numpy.output;
  Score by_evaluator = ParseScore(evaluator.output), by_numpy = ParseScore(numpy.output);
  EXPECT_GT(by_evaluator.accuracy, 0.6) << "trained for 400 updates; chance is 0.1";
  EXPECT_NEAR(by_numpy.accuracy, by_evaluator.accuracy, 1e-4);
  EXPECT_NEAR(by_numpy.loss, by_evaluator.loss, 1e-4);
  // The evaluator appended its row: wall_time, version (the lowest shard's), loss, accuracy (as
  // printed with fewer digits than its output, so compared as numbers).
  const std::string row = LastLine(csv);
  EXPECT_EQ(Column(row, 1), 400) << row;
  EXPECT_NEAR(Column(row, 2), by_evaluator.loss, 1e-4) << row;
  EXPECT_NEAR(Column(row, 3), by_evaluator.accuracy, 1e-4) << row;
}

const char kSmallModel[] = "mlp:784-8-10";

// Writes shard `shard`'s checkpoint at `version` of a job of `model` (kSmallModel by default)
// with `num_shards` shards; its values are shard + version / 1000.
void WriteCheckpoint(const std::string& dir, int shard, int num_shards, int64_t version,
                     const std::string& optimizer = "sgd", const std::string& model = kSmallModel) {
  const ModelIdentity identity = *ParseModelSpec(model, num_shards);
  ShardState c;
  c.header.set_model(identity.fingerprint);
  c.header.set_shard_index(shard);
  c.header.set_num_shards(num_shards);
  c.header.set_optimizer(optimizer);
  c.header.set_consistency("async");
  c.header.set_version(version);
  v1::WorkerState* worker = c.header.add_workers();  // whose pushes made the version
  worker->set_pushes_applied(version);
  worker->set_clock(version);
  worker->set_last_sequence(version - 1);
  c.AddTensor(kValuesTensor)
      .assign(PartRange(identity.total_params, shard, num_shards).size(),
              shard + version / 1000.0f);
  absl::StatusOr<std::string> path = CheckpointStore(dir, shard, 3).Write(c);
  ASSERT_TRUE(path.ok()) << path.status();
}

void ExpectRefusal(const absl::StatusOr<ModelFile>& file, absl::StatusCode code,
                   const std::string& says) {
  EXPECT_EQ(file.status().code(), code) << file.status();
  EXPECT_NE(file.status().message().find(says), std::string::npos) << file.status();
}

// A CNN's file (same-padded and strided convolutions, pooling, dense layers; He-initialised
// weights): NumPy's forward pass gives the evaluator's loss.
TEST(ExportTest, NumPyScoresACnnFileAsTheEvaluator) {
  const std::string dir = NewRunDir("export");
  const std::string model = "cnn:1x28x28-conv4k5-pool2-conv8k3s2-fc16-10";
  std::unique_ptr<Backend> cpu = MakeCpuBackend(1);
  const std::string file = dir + "/cnn.safetensors";
  ASSERT_TRUE(
      WriteModelFile(file,
                     {model, {7}, Network(*ParseNetworkSpec(model), 1, cpu.get()).InitialParams(3)})
          .ok());
  Finished evaluator = RunProgram({"evaluator", "--model_file=" + file, "--model=" + model});
  ASSERT_EQ(evaluator.code, 0) << evaluator.output;
  Finished numpy =
      RunProgram({PS_PYTHON, std::string(PS_SOURCE_DIR) + "/tools/score_model.py", file});
  ASSERT_EQ(numpy.code, 0) << numpy.output;
  std::cout << "evaluator: " << evaluator.output << "numpy: " << numpy.output;
  Score by_evaluator = ParseScore(evaluator.output), by_numpy = ParseScore(numpy.output);
  ASSERT_GT(by_evaluator.loss, 0) << evaluator.output;
  EXPECT_NEAR(by_numpy.loss, by_evaluator.loss, 1e-4);
  EXPECT_NEAR(by_numpy.accuracy, by_evaluator.accuracy, 2e-4) << "a near tie may flip one image";
}

TEST(ExportTest, CheckpointsMissingCorruptOfAnotherModelOrOfDifferentJobsAreRefused) {
  const std::string dir = NewRunDir("export");
  ExpectRefusal(ModelFromCheckpoints(dir + "/none", kSmallModel), absl::StatusCode::kNotFound,
                "no checkpoint directory " + dir + "/none");
  ExpectRefusal(ModelFromCheckpoints(dir, kSmallModel), absl::StatusCode::kNotFound,
                "no readable checkpoint of shard 0 in " + dir);
  WriteCheckpoint(dir, 0, 2, 10);
  ExpectRefusal(ModelFromCheckpoints(dir, kSmallModel), absl::StatusCode::kNotFound,
                "no readable checkpoint of shard 1 in " + dir + " (the job has 2 shards)");
  WriteCheckpoint(dir, 1, 2, 12);
  absl::StatusOr<ModelFile> file = ModelFromCheckpoints(dir, kSmallModel);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->versions, (std::vector<int64_t>{10, 12}));
  const int64_t half = PartRange(file->params.size(), 0, 2).end;
  EXPECT_EQ(file->params[half - 1], 0.010f);
  EXPECT_EQ(file->params[half], 1.012f);
  ExpectRefusal(ModelFromCheckpoints(dir, "mlp:784-256-128-10"), absl::StatusCode::kInvalidArgument,
                "are of model mlp:784-8-10, expected mlp:784-256-128-10");

  // A torn newest checkpoint of shard 1: the previous one is used, as the shard would resume.
  WriteCheckpoint(dir, 1, 2, 20);
  const std::string newest = dir + "/shard-1-000000000020.safetensors";
  std::filesystem::resize_file(newest, std::filesystem::file_size(newest) - 5);
  file = ModelFromCheckpoints(dir, kSmallModel);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->versions, (std::vector<int64_t>{10, 12}));
  // Corrupt the previous one too: shard 1 has none left.
  const std::string previous = dir + "/shard-1-000000000012.safetensors";
  std::string bytes = ReadFile(previous);
  bytes.back() ^= 1;
  std::ofstream(previous, std::ios::binary | std::ios::trunc) << bytes;
  ExpectRefusal(ModelFromCheckpoints(dir, kSmallModel), absl::StatusCode::kNotFound,
                "no readable checkpoint of shard 1");

  // Shards of different jobs: another optimizer, another shard count.
  WriteCheckpoint(dir, 1, 2, 30, "adam");
  ExpectRefusal(ModelFromCheckpoints(dir, kSmallModel), absl::StatusCode::kFailedPrecondition,
                "are of different jobs: shard 0 is of (mlp:784-8-10, 2 shards, sgd, async), the "
                "newest of shard 1 is shard 1 of (mlp:784-8-10, 2 shards, adam, async)");
  WriteCheckpoint(dir, 1, 3, 40);
  ExpectRefusal(ModelFromCheckpoints(dir, kSmallModel), absl::StatusCode::kFailedPrecondition,
                "3 shards");

  // A tensor layout's job exported as the tools' default MLP: told to pass the layout.
  const std::string layouts = NewRunDir("export");
  const std::string layout = R"({"tensors": [{"name": "fc.weight", "shape": [10, 784]}]})";
  WriteCheckpoint(layouts, 0, 1, 3, "sgd", layout);
  ExpectRefusal(ModelFromCheckpoints(layouts, "mlp:784-256-128-10"),
                absl::StatusCode::kInvalidArgument,
                "expected mlp:784-256-128-10: the job's model is a tensor layout, pass it as "
                "--model=FILE.json");
  EXPECT_TRUE(ModelFromCheckpoints(layouts, layout).ok());
}

TEST(ExportTest, TheToolsExitWithAOneLineReasonOnBadFlagsFilesAndModels) {
  const std::string dir = NewRunDir("export"), file = dir + "/model.safetensors";
  WriteCheckpoint(dir, 0, 1, 5);
  auto expect_failure = [](const Finished& run, const std::string& says) {
    EXPECT_EQ(run.code, 1) << run.output;
    EXPECT_NE(run.output.find(says), std::string::npos) << run.output;
  };
  expect_failure(RunProgram({"export_model", "--out=" + file}),
                 "export_model: give either --checkpoint_dir or --ps");
  expect_failure(
      RunProgram({"export_model", "--checkpoint_dir=" + dir, "--ps=127.0.0.1:1", "--out=" + file}),
      "export_model: give either --checkpoint_dir or --ps");
  expect_failure(RunProgram({"export_model", "--checkpoint_dir=" + dir}),
                 "export_model: --out is required");
  expect_failure(RunProgram({"export_model", "--checkpoint_dir=" + dir + "/none", "--out=" + file}),
                 "export_model: no checkpoint directory");
  expect_failure(RunProgram({"export_model", "--checkpoint_dir=" + dir, "--out=" + file}),
                 "are of model mlp:784-8-10, expected mlp:784-256-128-10");
  EXPECT_FALSE(std::filesystem::exists(file));
  Finished ok =
      RunProgram({"export_model", "--checkpoint_dir=" + dir, "--hidden=8", "--out=" + file});
  ASSERT_EQ(ok.code, 0) << ok.output;

  expect_failure(RunProgram({"evaluator", "--model_file=" + file}),
                 "evaluator: " + file + ": holds model mlp:784-8-10, expected mlp:784-256-128-10");
  expect_failure(
      RunProgram(
          {"evaluator", "--model_file=" + dir + "/shard-0-000000000005.safetensors", "--hidden=8"}),
      "not a model file (format 'ps.shard.v1'");
  expect_failure(RunProgram({"evaluator", "--model_file=" + dir + "/none.safetensors"}),
                 "evaluator: cannot open " + dir + "/none.safetensors");
  Finished scored = RunProgram({"evaluator", "--model_file=" + file, "--hidden=8"});
  EXPECT_EQ(scored.code, 0) << scored.output;
  EXPECT_NE(scored.output.find("versions [5]): test loss"), std::string::npos) << scored.output;
}

}  // namespace
}  // namespace ps
