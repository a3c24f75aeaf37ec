// One shard of the parameter server as a whole (what `ps` runs): the ParameterShard, its
// Checkpointer and Replica (each optional), the metrics endpoint (optional), the ShardService and
// ReplicationService, and the grpc::Server that serves them with grpc.health.v1, owned together
// and shut down in the order they depend on each other.
//
//   Create  checks the configuration and builds the shard: binds no port, writes no file
//           (ps --dry_run stops here).
//   Start   resumes from the newest checkpoint, starts the metrics endpoint and the data plane,
//           listens, starts replication and writes the port file.
//   Wait    serves, doing the housekeeping (health SERVING while the shard can serve, lease
//           expiry, idle shared memory given back, a status line every 30 s), until told to stop
//           or until this replica is fenced.
//   Stop    health off, replication stopped, the shard shut down, calls in progress given 1 s,
//           the last checkpoint, the output files; says why the process must exit with an error.
//
// Create, Start, Wait and Stop are called from one thread, in that order (Wait may be left out);
// the services run on gRPC's threads meanwhile. Destroying a server that was not stopped shuts it
// down as Stop does, without the output files.
#pragma once

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/metrics.h"
#include "transport/security.h"
#include "server/checkpoints/checkpointer.h"
#include "server/replication/replica.h"
#include "server/rpc/replication_service.h"
#include "server/rpc/shard_service.h"
#include "server/state/parameter_shard.h"

namespace ps {

struct ShardServerConfig {
  ShardConfig shard;
  ServiceLimits limits;
  ServerSecurity security;                  // by default plaintext (null credentials) and no tokens
  std::optional<Replica::Options> replica;  // replication (ps --peer); none: alone
  std::optional<Checkpointer::Options> checkpoints;  // ps --checkpoint_dir; none: no checkpoints
  std::string host = "127.0.0.1";
  int port = 0;  // 0: a free one (port())
  // The bulk data plane's port on `host` (transport/data_plane.h; 0: a free one, -1: none); it
  // speaks TLS when `security` does.
  int data_plane_port = 0;
  // TCP connections per client on the data plane, a large tensor striped over them (1..8).
  int data_plane_lanes = 1;
  // Allow a non-loopback host without a token or mutual TLS (CheckListenHost).
  bool insecure = false;
  MetricsOptions metrics;  // by default no endpoint
  // Written at Start once serving (the bound port) and at Stop (the staleness histogram as
  // staleness,count lines; the statistics as JSON); "": none. Each atomically.
  std::string port_file, staleness_csv, stats_json;
};

class ShardServer {
 public:
  // Fails with a one-line reason (naming ps's flags where one is at fault) for a configuration
  // ParameterShard::Create refuses, a host that may not be listened on, or limits out of range.
  static absl::StatusOr<std::unique_ptr<ShardServer>> Create(ShardServerConfig config);
  ~ShardServer();
  ShardServer(const ShardServer&) = delete;
  ShardServer& operator=(const ShardServer&) = delete;

  // Fails with a one-line reason when the checkpoints cannot be opened or resumed from, the
  // metrics endpoint or the port cannot be served ("cannot listen on HOST:PORT: why"),
  // replication cannot start, or the port file cannot be written. Call once.
  absl::Status Start();
  // The port served; 0 before Start.
  int port() const { return port_; }

  // Serves until stop_requested(timeout), which waits up to `timeout` and says whether to stop
  // (e.g. WaitForShutdown), returns true, or this replica is fenced. REQUIRES: Start succeeded.
  void Wait(absl::FunctionRef<bool(absl::Duration)> stop_requested);

  // Shuts down (see above) and writes the output files. OK, or why the process must not exit
  // as if all went well: this replica was fenced (FAILED_PRECONDITION, its reason), or its last
  // checkpoint was not written (Checkpointer::final_status). Call once.
  absl::Status Stop();

 private:
  explicit ShardServer(ShardServerConfig config);
  // Stops serving and saving in dependency order; idempotent. Stop and the destructor.
  void ShutDown();
  void WriteOutputs(const ShardStats& stats) const;
  // Starts the data plane unless it is off.
  absl::Status StartDataPlane();
  // Sets health to SERVING while the shard can serve clients (initialised, and the primary when
  // replicated), NOT_SERVING otherwise or once shut down. `initialized`: the shard is known to be
  // initialised (which it stays). Thread-safe; calls nothing on the shard, so that the shard's
  // change listener can call it, under the shard's lock, as the initialisation happens: health
  // says SERVING before the shard answers a pull or the Initialize call.
  void UpdateHealth(bool initialized) ABSL_LOCKS_EXCLUDED(health_mu_);

  const ShardServerConfig config_;
  ShardProcess process_;
  // Declared in the order they depend on each other, so destroyed the other way round. Start sets
  // the shard's change listener (the checkpointer and the replica) once both exist.
  std::unique_ptr<ParameterShard> shard_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<Replica> replica_;
  std::unique_ptr<MetricsEndpoint> metrics_;
  std::unique_ptr<DataPlane> data_plane_;
  std::unique_ptr<ShardService> service_;
  std::unique_ptr<ReplicationService> replication_service_;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex health_mu_;
  grpc::HealthCheckServiceInterface* health_ ABSL_GUARDED_BY(health_mu_) = nullptr;  // server_'s
  bool initialized_ ABSL_GUARDED_BY(health_mu_) = false;    // seen initialised
  bool serving_ ABSL_GUARDED_BY(health_mu_) = false;        // what health says
  bool health_closed_ ABSL_GUARDED_BY(health_mu_) = false;  // shut down: NOT_SERVING for good
  int port_ = 0;
  std::string fenced_;  // why this replica must stop, once it must
  bool shut_down_ = false;
};

}  // namespace ps
