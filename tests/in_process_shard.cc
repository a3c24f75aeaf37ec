#include "tests/in_process_shard.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ps {

ShardServerConfig ShardOf(const std::string& model, int num_workers, int index, int shards) {
  ShardServerConfig c;
  c.shard.shard_index = index;
  c.shard.num_shards = shards;
  c.shard.model = model;
  c.shard.num_workers = num_workers;
  return c;
}

absl::StatusOr<std::unique_ptr<InProcessShard>> InProcessShard::Start(ShardServerConfig config) {
  config.host = "127.0.0.1";
  config.port = 0;
  absl::StatusOr<std::unique_ptr<ShardServer>> server = ShardServer::Create(std::move(config));
  if (!server.ok()) return server.status();
  if (absl::Status s = (*server)->Start(); !s.ok()) return s;
  return std::unique_ptr<InProcessShard>(new InProcessShard(*std::move(server)));
}

InProcessShard::InProcessShard(std::unique_ptr<ShardServer> server) : server_(std::move(server)) {
  housekeeping_ = std::thread([this] {
    server_->Wait([this](absl::Duration d) { return stop_.WaitForNotificationWithTimeout(d); });
  });
}

InProcessShard::~InProcessShard() {
  if (!stopped_) Stop().IgnoreError();
}

std::string InProcessShard::address() const { return absl::StrCat("127.0.0.1:", server_->port()); }

absl::Status InProcessShard::Stop() {
  stopped_ = true;
  stop_.Notify();
  housekeeping_.join();
  return server_->Stop();
}

}  // namespace ps
