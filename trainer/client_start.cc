#include "trainer/client_start.h"

#include <algorithm>
#include <optional>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "transport/security.h"
#include "common/log.h"
#include "common/shutdown.h"

ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist", "Fashion-MNIST IDX files.");
ABSL_FLAG(std::string, csv, "",
          "Append a row here per step (worker: step,wall_time,loss,base_version,...) or per "
          "evaluation (evaluator: wall_time,version,test_loss,test_accuracy).");
ABSL_FLAG(std::string, device, "auto",
          "auto | cpu | cuda | cuda:N. auto and cuda take GPU (local rank mod GPUs), the local "
          "rank being $LOCAL_RANK or else the worker's --rank; auto falls back to the CPU when no "
          "GPU is usable (saying why).");
ABSL_FLAG(int, threads, 1, "BLAS threads of the CPU backend.");

namespace ps {

absl::StatusOr<ClientStart> StartClient(const std::string& log_tag, int rank, bool needs_shards,
                                        bool checks_only, const SettingTexts& own) {
  ClientStart start;
  absl::StatusOr<ClientConnection> connection =
      ClientConnectionFromFlags(needs_shards, ClientKind::kDaemon, own);
  if (!connection.ok()) return connection.status();
  start.connection = *std::move(connection);
  if (IsLayoutSpec(start.connection.model)) {
    return absl::InvalidArgumentError(
        "--model is a tensor layout: the C++ worker and evaluator build mlp: and cnn: networks "
        "only; train a layout model with Python workers (paramserver.torch)");
  }
  absl::StatusOr<NetworkSpec> network = ResolveModel(start.connection.model, "");
  if (!network.ok()) return network.status();
  if (absl::Status s = network->FitsFashionMnist(); !s.ok()) return s;
  start.network = *std::move(network);
  start.data_dir = absl::GetFlag(FLAGS_data_dir);
  start.csv = absl::GetFlag(FLAGS_csv);
  if (checks_only) return start;
  SetLogTag(log_tag);
  InstallShutdownHandler();
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> metrics = StartMetricsFromFlags();
  if (!metrics.ok()) return metrics.status();
  start.metrics = *std::move(metrics);
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      MakeBackend(absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_threads), std::max(rank, 0));
  if (!backend.ok()) return backend.status();
  start.backend = *std::move(backend);
  absl::StatusOr<std::unique_ptr<grpc::Server>> health = StartHealthFromFlags();
  if (!health.ok()) return health.status();
  start.health = *std::move(health);
  return start;
}

}  // namespace ps
