// A ShardServer in the test's own process, served to a ShardedClient over gRPC on 127.0.0.1 (port
// chosen at run time): started, used by a worker, stopped, and its output files written.
#include "server/shard_server.h"

#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "tests/in_process_shard.h"
#include "tests/run_dir.h"
#include "client/sharded_client.h"

namespace ps {
namespace {

TEST(ShardServerTest, ServesAWorkerThenStopsAndWritesItsOutputs) {
  const std::string dir = NewRunDir("shard-server");
  const ModelIdentity model{"flat:1000", 1000, 1};
  ShardServerConfig config = ShardOf(model.fingerprint, 1);
  config.shard.optimizer.name = "sgd";
  config.shard.learning_rate.base = 1;
  config.port_file = dir + "/port";
  config.staleness_csv = dir + "/staleness.csv";
  config.stats_json = dir + "/stats.json";
  absl::StatusOr<std::unique_ptr<ShardServer>> server = ShardServer::Create(config);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->port(), 0);
  ASSERT_TRUE((*server)->Start().ok());
  const int port = (*server)->port();
  ASSERT_GT(port, 0);
  EXPECT_EQ(ReadFile(dir + "/port"), absl::StrCat(port, "\n"));
  absl::Notification stop;
  std::thread serving([&] {
    (*server)->Wait([&](absl::Duration d) { return stop.WaitForNotificationWithTimeout(d); });
  });

  {
    ShardedClient worker({absl::StrCat("127.0.0.1:", port)}, model, 0);
    absl::StatusOr<int64_t> first_step = worker.Register();
    ASSERT_TRUE(first_step.ok()) << first_step.status();
    EXPECT_EQ(*first_step, 0);
    absl::StatusOr<int> initialized = worker.Initialize(std::vector<float>(1000, 0.0f));
    ASSERT_TRUE(initialized.ok()) << initialized.status();
    EXPECT_EQ(*initialized, 1);
    absl::StatusOr<ShardedClient::PushSummary> pushed = worker.Push(std::vector<float>(1000, 1.0f));
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    std::vector<float> weights(1000);
    absl::StatusOr<ShardedClient::Versions> pulled = worker.Pull(absl::MakeSpan(weights));
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    EXPECT_EQ(weights, std::vector<float>(1000, -1.0f));  // sgd, lr 1: 0 - 1 * 1
  }

  stop.Notify();
  serving.join();
  EXPECT_TRUE((*server)->Stop().ok());
  EXPECT_EQ(ReadFile(dir + "/staleness.csv").rfind("staleness,count\n0,1\n", 0), 0)
      << ReadFile(dir + "/staleness.csv");
  v1::StatsResponse stats;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(ReadFile(dir + "/stats.json"), &stats).ok())
      << ReadFile(dir + "/stats.json");
  EXPECT_EQ(stats.version(), 1);
  EXPECT_EQ(stats.pushes_applied(), 1);
  EXPECT_TRUE(stats.initialized());
  EXPECT_EQ(stats.registered_workers(), 1);
  // The service's own counts too: the client is on this host, so its tensors took shared memory.
  EXPECT_EQ(stats.shm_pushes(), 1);
  EXPECT_EQ(stats.shm_pulls(), 1);
}

TEST(ShardServerTest, ABadConfigurationIsRefusedBeforeAnythingIsServed) {
  ShardServerConfig config = ShardOf("flat:2", 1, /*index=*/0, /*shards=*/3);
  absl::StatusOr<std::unique_ptr<ShardServer>> server = ShardServer::Create(config);
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("fewer parameters (2) than shards"), std::string::npos)
      << server.status();
  config = ShardOf("flat:4", 1);
  config.limits.shm_clients = -1;
  EXPECT_EQ(ShardServer::Create(config).status().message(),
            "--shm_clients must be >= 0 (0: no shared memory)");
}

}  // namespace
}  // namespace ps
