// evaluator: pulls the weights every few seconds, scores them on the 10,000 test images and
// appends (wall_time, version, test_loss, test_accuracy) to a CSV. On SIGTERM it scores the final
// weights once more before exiting, so the last row is the run's result. With --model_file it
// scores an exported model (export_model) once, offline.
#include <prometheus/gauge.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/cluster.h"
#include "common/cluster_spec.h"
#include "common/csv_writer.h"
#include "common/log.h"
#include "common/model_spec.h"
#include "transport/reflection.h"
#include "common/shutdown.h"
#include "kernels/backend.h"
#include "trainer/client_start.h"
#include "trainer/idx_dataset.h"
#include "trainer/model_file.h"
#include "trainer/network.h"
#include "client/sharded_client.h"

ABSL_FLAG(double, interval_seconds, 2, "Seconds between evaluations.");
ABSL_FLAG(std::string, model_file, "",
          "Score this exported model file (export_model) once, offline, instead of the shards'.");

namespace ps {
namespace {

int Fail(const std::string& reason) { return FailMain("evaluator", reason); }

absl::StatusOr<CsvWriter> OpenCsv(const std::string& path) {
  return CsvWriter::Open(path.empty() ? "/dev/null" : path,
                         {"wall_time", "version", "test_loss", "test_accuracy"});
}

// Examples scored at once: a convolution's scratch grows with the batch (im2col's windows).
int EvaluationBatch(const NetworkSpec& network) { return network.convolutional ? 100 : 1000; }

std::vector<std::string> CsvRow(int64_t version, const Network::Score& score) {
  return {WallTimeField(), absl::StrCat(version), absl::StrFormat("%.5f", score.loss),
          absl::StrFormat("%.4f", score.accuracy)};
}

// --model_file: scores the file on the test set, prints the result and appends it to --csv.
int ScoreModelFile(const ClientStart& started) {
  const NetworkSpec& network = started.network;
  const std::string path = absl::GetFlag(FLAGS_model_file);
  absl::StatusOr<ModelFile> file = ReadModelFile(path, network.ToString());
  if (!file.ok()) return Fail(std::string(file.status().message()));
  absl::StatusOr<Examples> test = LoadFashionMnist(started.data_dir, "t10k");
  if (!test.ok()) return Fail(std::string(test.status().message()));
  absl::StatusOr<CsvWriter> csv = OpenCsv(started.csv);
  if (!csv.ok()) return Fail(std::string(csv.status().message()));
  if (absl::Status s = network.FitsBatch(EvaluationBatch(network)); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  Network mlp(network, EvaluationBatch(network), started.backend.get());
  Network::Score score =
      mlp.Evaluate(file->params, test->features.data(), test->labels.data(), test->count);
  int64_t version = *std::min_element(file->versions.begin(), file->versions.end());
  csv->Row(CsvRow(version, score));
  std::printf("%s\n", absl::StrFormat("%s (%s, versions [%s]): test loss %.6f, accuracy %.4f", path,
                                      file->model, absl::StrJoin(file->versions, ","), score.loss,
                                      score.accuracy)
                          .c_str());
  return 0;
}

// The evaluator's Prometheus gauges (--metrics_port): the last evaluation's accuracy, loss and
// version. Without an endpoint, nothing.
class EvaluationMetrics {
 public:
  explicit EvaluationMetrics(MetricsEndpoint* endpoint) {
    if (endpoint == nullptr) return;
    prometheus::Registry& r = endpoint->registry();
    accuracy_ = &prometheus::BuildGauge()
                     .Name("evaluator_test_accuracy")
                     .Help("Test accuracy of the last weights evaluated.")
                     .Register(r)
                     .Add({});
    loss_ = &prometheus::BuildGauge()
                 .Name("evaluator_test_loss")
                 .Help("Mean test loss of the last weights evaluated.")
                 .Register(r)
                 .Add({});
    version_ = &prometheus::BuildGauge()
                    .Name("evaluator_version")
                    .Help("Version (lowest over the shards) of the last weights evaluated.")
                    .Register(r)
                    .Add({});
  }
  void Set(int64_t version, const Network::Score& score) {
    if (accuracy_ == nullptr) return;
    accuracy_->Set(score.accuracy);
    loss_->Set(score.loss);
    version_->Set(static_cast<double>(version));
  }

 private:
  prometheus::Gauge* accuracy_ = nullptr;
  prometheus::Gauge* loss_ = nullptr;
  prometheus::Gauge* version_ = nullptr;
};

// Pulls and scores the shards' weights every --interval_seconds, a CSV row and a log line for
// each new version, until shutdown; then scores the weights once more (if there are any yet), so
// that the last row is the run's result. Returns main's exit status.
int EvaluateUntilShutdown(ShardedClient& client, CancelOnShutdown& cancel_on_shutdown, Network& mlp,
                          const Examples& test, CsvWriter& csv, EvaluationMetrics& metrics) {
  std::vector<float> params(mlp.num_params());
  int64_t last_version = -1;
  bool pulled = false;  // once: the model exists
  for (bool stopping = false; !stopping;) {
    stopping = ShutdownRequested();
    if (stopping && !pulled) break;  // never initialised: nothing to score
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
    pulled = true;
    int64_t version = versions->Min();
    if (version != last_version) {
      // A periodic evaluation gives way to a shutdown (the final one, which is not stopped,
      // follows at once: scoring a CNN takes a while).
      Network::Score score =
          mlp.Evaluate(params, test.features.data(), test.labels.data(), test.count,
                       stopping ? std::function<bool()>() : ShutdownRequested);
      if (score.rows < test.count) continue;
      csv.Row(CsvRow(version, score));
      metrics.Set(version, score);
      PS_LOG(INFO) << absl::StrFormat("version %d: test loss %.4f, accuracy %.4f", version,
                                      score.loss, score.accuracy);
      last_version = version;
    }
    if (!stopping) WaitForShutdown(absl::Seconds(absl::GetFlag(FLAGS_interval_seconds)));
  }
  return 0;
}

int Main(int argc, char** argv) {
  EnableServerReflection();
  absl::StatusOr<ParsedCommandLine> parsed = ParseDaemonFlags(
      argc, argv, "evaluator",
      "Test-set evaluator.\nExample: evaluator --ps=host1:50051,host2:50051 --csv=eval.csv\n"
      "         evaluator --model_file=model.safetensors (offline, no shards)");
  if (!parsed.ok()) return Fail(std::string(parsed.status().message()));
  if (!parsed->positional.empty()) {
    return Fail("unexpected argument '" + parsed->positional[0] + "' (flags are --name=value)");
  }
  const bool offline = !absl::GetFlag(FLAGS_model_file).empty();
  absl::StatusOr<ClientStart> started = StartClient("evaluator", /*rank=*/-1, !offline);
  if (!started.ok()) return Fail(std::string(started.status().message()));
  if (!parsed->spec_summary.empty()) {
    PS_LOG(INFO) << "from the cluster spec: " << parsed->spec_summary;
  }
  if (offline) return ScoreModelFile(*started);
  const ClientConnection& shards = started->connection;

  absl::StatusOr<Examples> test = LoadFashionMnist(started->data_dir, "t10k");
  if (!test.ok()) return Fail(std::string(test.status().message()));
  if (absl::Status s = started->network.FitsBatch(EvaluationBatch(started->network)); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  Network mlp(started->network, EvaluationBatch(started->network), started->backend.get());
  ShardedClient client(
      shards.addresses,
      {mlp.Fingerprint(), mlp.num_params(), static_cast<int>(shards.addresses.size())},
      /*worker_id=*/-1, shards.options);
  CancelOnShutdown cancel_on_shutdown(&client);  // the final pull below starts afresh
  if (absl::StatusOr<int64_t> r = client.Register(); !r.ok()) {
    return ShutdownRequested() ? 0 : Fail(std::string(r.status().message()));
  }
  absl::StatusOr<CsvWriter> csv = OpenCsv(started->csv);
  if (!csv.ok()) return Fail(std::string(csv.status().message()));
  EvaluationMetrics metrics(started->metrics.get());
  const int status = EvaluateUntilShutdown(client, cancel_on_shutdown, mlp, *test, *csv, metrics);
  if (status == 0 && started->health != nullptr) started->health->Shutdown();
  return status;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
