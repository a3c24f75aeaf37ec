// evaluator: pulls the weights every few seconds, scores them on the 10,000 test images and
// appends (wall_time, version, test_loss, test_accuracy) to a CSV. On SIGTERM it scores the final
// weights once more before exiting, so the last row is the run's result. With --model_file it
// scores an exported model (export_model) once, offline.
#include <algorithm>
#include <cstdio>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/cluster.h"
#include "common/csv_writer.h"
#include "common/log.h"
#include "common/shutdown.h"
#include "kernels/backend.h"
#include "worker/client_flags.h"
#include "worker/idx_dataset.h"
#include "worker/mlp.h"
#include "worker/model_file.h"
#include "worker/sharded_client.h"

ABSL_FLAG(std::string, ps, "",
          "Shard addresses in shard order: host:port,host:port,... (a replicated shard: its two "
          "replicas as host:port/host:port).");
ABSL_FLAG(std::string, hidden, "256,128", "Hidden layer sizes of the MLP (as the workers').");
ABSL_FLAG(double, interval_seconds, 2, "Seconds between evaluations.");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist", "Fashion-MNIST IDX files.");
ABSL_FLAG(std::string, csv, "", "Append a row per evaluation here.");
ABSL_FLAG(std::string, device, "cpu", "auto | cpu | cuda | cuda:N.");
ABSL_FLAG(int, threads, 1, "BLAS threads of the CPU backend.");
ABSL_FLAG(double, retry_seconds, 60, "Give up after a shard has been unreachable this long.");
ABSL_FLAG(std::string, model_file, "",
          "Score this exported model file (export_model) once, offline, instead of the shards'.");

namespace ps {
namespace {

int Fail(const std::string& reason) { return FailMain("evaluator", reason); }

absl::StatusOr<CsvWriter> OpenCsv() {
  return CsvWriter::Open(absl::GetFlag(FLAGS_csv).empty() ? "/dev/null" : absl::GetFlag(FLAGS_csv),
                         {"wall_time", "version", "test_loss", "test_accuracy"});
}

std::vector<std::string> CsvRow(int64_t version, const Mlp::Score& score) {
  return {WallTimeField(), absl::StrCat(version), absl::StrFormat("%.5f", score.loss),
          absl::StrFormat("%.4f", score.accuracy)};
}

// --model_file: scores the file on the test set, prints the result and appends it to --csv.
int ScoreModelFile(const std::vector<int>& sizes) {
  const std::string path = absl::GetFlag(FLAGS_model_file);
  absl::StatusOr<ModelFile> file = ReadModelFile(path, MlpSpec(sizes));
  if (!file.ok()) return Fail(std::string(file.status().message()));
  absl::StatusOr<Examples> test = LoadFashionMnist(absl::GetFlag(FLAGS_data_dir), "t10k");
  if (!test.ok()) return Fail(std::string(test.status().message()));
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      MakeBackend(absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_threads));
  if (!backend.ok()) return Fail(std::string(backend.status().message()));
  absl::StatusOr<CsvWriter> csv = OpenCsv();
  if (!csv.ok()) return Fail(std::string(csv.status().message()));
  Mlp mlp(sizes, /*max_batch=*/1000, backend->get());
  Mlp::Score score =
      mlp.Evaluate(file->params, test->features.data(), test->labels.data(), test->count);
  int64_t version = *std::min_element(file->versions.begin(), file->versions.end());
  csv->Row(CsvRow(version, score));
  std::printf("%s\n", absl::StrFormat("%s (%s, versions [%s]): test loss %.6f, accuracy %.4f", path,
                                      file->model, absl::StrJoin(file->versions, ","), score.loss,
                                      score.accuracy)
                          .c_str());
  return 0;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Test-set evaluator.\nExample: evaluator --ps=host1:50051,host2:50051 --csv=eval.csv\n"
      "         evaluator --model_file=model.safetensors (offline, no shards)");
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<std::vector<int>> sizes = MlpLayerSizes(784, absl::GetFlag(FLAGS_hidden), 10);
  if (!sizes.ok()) return Fail(std::string(sizes.status().message()));
  if (!absl::GetFlag(FLAGS_model_file).empty()) return ScoreModelFile(*sizes);
  absl::StatusOr<std::vector<std::string>> addresses = ParseShardAddresses(absl::GetFlag(FLAGS_ps));
  if (!addresses.ok()) return Fail(std::string(addresses.status().message()));
  SetLogTag("evaluator");
  absl::StatusOr<ClientSecurity> security = ClientSecurityFromFlags();
  if (!security.ok()) return Fail(std::string(security.status().message()));
  InstallShutdownHandler();

  absl::StatusOr<Examples> test = LoadFashionMnist(absl::GetFlag(FLAGS_data_dir), "t10k");
  if (!test.ok()) return Fail(std::string(test.status().message()));
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      MakeBackend(absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_threads));
  if (!backend.ok()) return Fail(std::string(backend.status().message()));
  Mlp mlp(*sizes, /*max_batch=*/1000, backend->get());

  absl::StatusOr<std::unique_ptr<grpc::Server>> health = StartHealthFromFlags();
  if (!health.ok()) return Fail(std::string(health.status().message()));
  ClientOptions options;
  absl::StatusOr<WireType> pull_type = PullTypeFromFlags();
  if (!pull_type.ok()) return Fail(std::string(pull_type.status().message()));
  options.pull_type = *pull_type;
  options.retry_for = absl::Seconds(absl::GetFlag(FLAGS_retry_seconds));
  options.security = *std::move(security);
  ShardedClient client(*addresses,
                       {mlp.Fingerprint(), mlp.num_params(), static_cast<int>(addresses->size())},
                       /*worker_id=*/-1, options);
  CancelOnShutdown cancel_on_shutdown(&client);  // the final pull below starts afresh
  if (absl::StatusOr<int64_t> r = client.Register(); !r.ok()) {
    return ShutdownRequested() ? 0 : Fail(std::string(r.status().message()));
  }
  absl::StatusOr<CsvWriter> csv = OpenCsv();
  if (!csv.ok()) return Fail(std::string(csv.status().message()));

  std::vector<float> params(mlp.num_params());
  int64_t last_version = -1;
  // At shutdown, the weights are scored once more (if there are any yet): the last row is the
  // run's result.
  for (bool stopping = false; !stopping;) {
    stopping = ShutdownRequested();
    if (stopping && last_version < 0) break;  // never initialised: nothing to score
    if (stopping) {
      cancel_on_shutdown.Join();              // so that it cannot cancel the final pull
      client.LimitCallsTo(absl::Seconds(1));  // which must not wait on a dead shard
    }
    absl::StatusOr<ShardedClient::Versions> versions = client.Pull(absl::MakeSpan(params));
    if (!versions.ok()) {
      if (stopping) break;                // the shards may already be gone at shutdown
      if (ShutdownRequested()) continue;  // cancelled by the shutdown: go round for the last pull
      return Fail(absl::StrCat("pull failed: ", versions.status().message()));
    }
    int64_t version = versions->Min();
    if (version != last_version) {
      Mlp::Score score =
          mlp.Evaluate(params, test->features.data(), test->labels.data(), test->count);
      csv->Row(CsvRow(version, score));
      PS_LOG(INFO) << absl::StrFormat("version %d: test loss %.4f, accuracy %.4f", version,
                                      score.loss, score.accuracy);
      last_version = version;
    }
    if (!stopping) WaitForShutdown(absl::Seconds(absl::GetFlag(FLAGS_interval_seconds)));
  }
  if (*health != nullptr) (*health)->Shutdown();
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
