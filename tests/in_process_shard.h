// A shard served from the test's own process (ShardServer) on 127.0.0.1, its port chosen at run
// time, doing its housekeeping on a thread of its own as `ps` does on its main thread: the same
// service a test would otherwise start a `ps` process for, without the process.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "server/shard_server.h"

namespace ps {

// Shard `index` of `shards` of `model` for `num_workers` workers; the rest as ShardServerConfig,
// ShardConfig and ServiceLimits default it (not all as ps's flags do), to adjust before Start.
ShardServerConfig ShardOf(const std::string& model, int num_workers, int index = 0, int shards = 1);

class InProcessShard {
 public:
  // Creates and starts a ShardServer on 127.0.0.1 (config.host and config.port are set here);
  // fails as ShardServer::Create and Start do.
  static absl::StatusOr<std::unique_ptr<InProcessShard>> Start(ShardServerConfig config);
  // Stop() unless stopped.
  ~InProcessShard();

  std::string address() const;
  // Stops the housekeeping, then the server (ShardServer::Stop, as ps at SIGTERM): its status.
  // Call once.
  absl::Status Stop();

 private:
  explicit InProcessShard(std::unique_ptr<ShardServer> server);
  const std::unique_ptr<ShardServer> server_;
  absl::Notification stop_;
  std::thread housekeeping_;
  bool stopped_ = false;
};

}  // namespace ps
