// ps: a parameter-server shard daemon. Serves one contiguous range of the model's flat parameter
// vector over gRPC (ps.v1.ParameterServer plus grpc.health.v1.Health) until SIGTERM/SIGINT.
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <cstdio>
#include <fstream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/shutdown.h"
#include "server/parameter_shard.h"
#include "server/shard_service.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on.");
ABSL_FLAG(int, port, 50051, "Port to listen on; 0 picks a free one (see --port_file).");
ABSL_FLAG(std::string, port_file, "", "If set, write the bound port here once serving.");
ABSL_FLAG(int, shard_index, 0, "This shard's index i in [0, num_shards).");
ABSL_FLAG(int, num_shards, 1, "Number of shards S; shard i owns [i*N/S, (i+1)*N/S).");
ABSL_FLAG(std::string, optimizer, "momentum", "sgd | momentum | nesterov | adam | adagrad.");
ABSL_FLAG(double, lr, 0.01, "Learning rate.");
ABSL_FLAG(double, momentum, 0.9, "Momentum coefficient (momentum, nesterov).");
ABSL_FLAG(double, beta1, 0.9, "Adam beta1.");
ABSL_FLAG(double, beta2, 0.999, "Adam beta2.");
ABSL_FLAG(double, epsilon, 1e-8, "Adam / AdaGrad epsilon.");
ABSL_FLAG(std::string, staleness_csv, "",
          "If set, write the staleness histogram (staleness,count) here at shutdown.");

namespace ps {
namespace {

int Fail(const std::string& reason) { return FailMain("ps", reason); }

// Writes `text` to `path` atomically, so a reader never sees a partial file.
bool WriteFileAtomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    if (!out.flush()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

void WriteStalenessCsv(const std::string& path, const ShardStats& stats) {
  std::string text = "staleness,count\n";
  for (size_t k = 0; k < stats.staleness_counts.size(); ++k) {
    absl::StrAppend(&text, k, ",", stats.staleness_counts[k], "\n");
  }
  if (!WriteFileAtomically(path, text)) PS_LOG(WARNING) << "cannot write " << path;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Parameter-server shard.\nExample: ps --shard_index=0 --num_shards=2 --port=50051");
  absl::ParseCommandLine(argc, argv);
  int index = absl::GetFlag(FLAGS_shard_index), shards = absl::GetFlag(FLAGS_num_shards);
  if (shards < 1 || index < 0 || index >= shards) {
    return Fail(absl::StrCat("--shard_index=", index, " must be in [0, --num_shards=", shards,
                             ")"));
  }
  OptimizerConfig opt;
  opt.name = absl::GetFlag(FLAGS_optimizer);
  opt.learning_rate = static_cast<float>(absl::GetFlag(FLAGS_lr));
  opt.momentum = static_cast<float>(absl::GetFlag(FLAGS_momentum));
  opt.beta1 = static_cast<float>(absl::GetFlag(FLAGS_beta1));
  opt.beta2 = static_cast<float>(absl::GetFlag(FLAGS_beta2));
  opt.epsilon = static_cast<float>(absl::GetFlag(FLAGS_epsilon));
  if (absl::StatusOr<std::unique_ptr<Optimizer>> check = MakeOptimizer(opt, 0); !check.ok()) {
    return Fail(std::string(check.status().message()));
  }
  SetLogTag(absl::StrCat("ps[", index, "]"));
  InstallShutdownHandler();

  ParameterShard shard(index, shards, opt);
  ShardService service(&shard);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  std::string address = absl::StrCat(absl::GetFlag(FLAGS_host), ":", absl::GetFlag(FLAGS_port));
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return Fail("cannot listen on " + address);
  PS_LOG(INFO) << "shard " << index << "/" << shards << " serving on port " << port
               << " (optimizer " << opt.name << ", lr " << opt.learning_rate << ")";
  std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty() && !WriteFileAtomically(port_file, absl::StrCat(port, "\n"))) {
    return Fail("cannot write --port_file " + port_file);
  }

  while (!WaitForShutdown(absl::Seconds(30))) {
    ShardStats s = shard.Stats();
    PS_LOG(INFO) << "version " << s.version << ", " << s.registered_workers << " workers, "
                 << s.pushes_rejected << " pushes rejected";
  }
  shard.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  ShardStats s = shard.Stats();
  if (!absl::GetFlag(FLAGS_staleness_csv).empty()) {
    WriteStalenessCsv(absl::GetFlag(FLAGS_staleness_csv), s);
  }
  PS_LOG(INFO) << "stopped at version " << s.version << ": " << s.pushes_applied << " applied, "
               << s.pushes_duplicate << " duplicate, " << s.pushes_rejected << " rejected, "
               << s.pulls << " pulls";
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
