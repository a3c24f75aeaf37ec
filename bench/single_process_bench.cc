// single_process_bench: README command (1)'s model trained in one process with no parameter
// server, as the yardstick for the distributed demo: the same Mlp on the CPU backend, batch,
// seed, initial weights and momentum SGD (the shard's own Optimizer), scored on the test set every
// --eval_interval_seconds of training (scoring time not counted). Prints the training time to
// each accuracy in --targets; compare launch's time to the same accuracy in the same session.
//   single_process_bench --max_seconds=120
#include <iostream>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "kernels/backend.h"
#include "server/state/optimizer.h"
#include "trainer/batch_sampler.h"
#include "trainer/idx_dataset.h"
#include "trainer/network.h"

ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist", "Fashion-MNIST IDX files.");
ABSL_FLAG(int, batch_size, 64, "Minibatch size (the demo's workers use 64).");
ABSL_FLAG(double, lr, 0.01, "Learning rate (the demo's).");
ABSL_FLAG(double, momentum, 0.9, "Momentum (the demo's).");
ABSL_FLAG(int, threads, 1, "BLAS threads (the demo's workers use 1 each).");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the initial weights and batch order (the demo's).");
ABSL_FLAG(double, eval_interval_seconds, 2, "Training seconds between test-set scores.");
ABSL_FLAG(double, max_seconds, 120, "Stop after this much training.");
ABSL_FLAG(std::vector<std::string>, targets, std::vector<std::string>({"0.85", "0.87", "0.88"}),
          "Accuracies to time.");

namespace ps {
namespace {

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "README command (1)'s model trained in one process, the distributed demo's yardstick.\n"
      "  single_process_bench");
  absl::ParseCommandLine(argc, argv);
  const int batch = absl::GetFlag(FLAGS_batch_size);
  absl::StatusOr<Examples> train = LoadFashionMnist(absl::GetFlag(FLAGS_data_dir), "train");
  absl::StatusOr<Examples> test = LoadFashionMnist(absl::GetFlag(FLAGS_data_dir), "t10k");
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      MakeBackend("cpu", absl::GetFlag(FLAGS_threads));
  if (!train.ok() || !test.ok() || !backend.ok()) {
    std::cerr << "single_process_bench: cannot load the data or start the backend\n";
    return 1;
  }
  Network mlp(MlpNetwork({784, 256, 128, 10}), std::max(batch, 1000), backend->get());
  OptimizerConfig config;
  config.name = "momentum";
  config.momentum = static_cast<float>(absl::GetFlag(FLAGS_momentum));
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = MakeOptimizer(config, mlp.num_params());
  if (!optimizer.ok()) return 1;
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  std::vector<float> params = mlp.InitialParams(seed), grad(mlp.num_params());
  mlp.SetTrainingSet(train->features.data(), train->labels.data(), train->count);
  BatchSampler sampler(train->count, batch, seed * 1000003);
  std::vector<int32_t> indices;
  std::vector<double> targets;
  for (const std::string& t : absl::GetFlag(FLAGS_targets)) targets.push_back(std::stod(t));
  std::vector<double> reached(targets.size(), -1);
  const absl::Duration interval = absl::Seconds(absl::GetFlag(FLAGS_eval_interval_seconds));
  const absl::Duration limit = absl::Seconds(absl::GetFlag(FLAGS_max_seconds));
  absl::Duration trained;
  double best = 0;
  int64_t step = 0;
  absl::PrintF("single_process_bench: mlp:784-256-128-10, batch %d, momentum SGD lr %g\n", batch,
               absl::GetFlag(FLAGS_lr));
  while (trained < limit && reached.back() < 0) {
    const absl::Time start = absl::Now();
    while (absl::Now() - start < interval) {
      sampler.Indices(step++, &indices);
      mlp.GradientOfExamples(params, indices.data(), batch, absl::MakeSpan(grad));
      if (!(*optimizer)->Apply(absl::MakeSpan(params), grad, absl::GetFlag(FLAGS_lr), step).ok()) {
        std::cerr << "the update diverged\n";
        return 1;
      }
    }
    trained += absl::Now() - start;
    Network::Score score =
        mlp.Evaluate(params, test->features.data(), test->labels.data(), test->count);
    best = std::max(best, score.accuracy);
    for (size_t i = 0; i < targets.size(); ++i) {
      if (reached[i] < 0 && score.accuracy >= targets[i])
        reached[i] = absl::ToDoubleSeconds(trained);
    }
    absl::PrintF("%7.1f s  step %7d  epoch %5.2f  test accuracy %.4f\n",
                 absl::ToDoubleSeconds(trained), step, sampler.Epoch(step), score.accuracy);
  }
  absl::PrintF("steps/s %.0f; best accuracy %.4f\n", step / absl::ToDoubleSeconds(trained), best);
  for (size_t i = 0; i < targets.size(); ++i) {
    absl::PrintF("time to %.2f: %s\n", targets[i],
                 reached[i] < 0 ? "not reached" : absl::StrFormat("%.1f s", reached[i]));
  }
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
