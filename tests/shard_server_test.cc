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
#include "proto/ps.pb.h"

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

// What a worker holds on a shard beside its membership (a shared-memory segment, or data-plane
// connections; a compressed pull's view) is freed alike whether it leaves or its lease expires.
TEST(ShardServerTest, AWorkerThatLeavesAndOneWhoseLeaseExpiresFreeTheSameResources) {
  const ModelIdentity model{"flat:4096", 4096, 1};
  ShardServerConfig config = ShardOf(model.fingerprint, 4);
  // Long enough for the steps before the expiry phase on a slow, busy machine; workers 1 and 3
  // refresh theirs (a pull) just before it counts.
  config.shard.lease = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<InProcessShard>> shard = InProcessShard::Start(config);
  ASSERT_TRUE(shard.ok()) << shard.status();
  // Workers 0 and 1 through shared memory, 2 and 3 over the data plane, each with a pull view.
  std::vector<std::unique_ptr<ShardedClient>> workers;
  std::vector<float> values(model.total_params, 1.0f);
  for (int w = 0; w < 4; ++w) {
    ClientOptions options;
    options.shared_memory = w < 2;
    options.data_plane = w >= 2;
    options.pull_compression = {Compressor::kInt8, 0};
    workers.push_back(
        std::make_unique<ShardedClient>(std::vector<std::string>{(*shard)->address()}, model, w,
                                        options));
    ASSERT_TRUE(workers[w]->Register().ok());
    if (w == 0) ASSERT_TRUE(workers[w]->Initialize(values).ok());
    ASSERT_TRUE(workers[w]->Pull(absl::MakeSpan(values)).ok());
  }
  ClientOptions grpc_only;
  grpc_only.shared_memory = false;
  grpc_only.data_plane = false;
  ShardedClient observer({(*shard)->address()}, model, -1, grpc_only);
  ASSERT_TRUE(observer.Register().ok());
  auto stats = [&] {
    absl::StatusOr<std::vector<v1::StatsResponse>> s = observer.Stats();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? (*s)[0] : v1::StatsResponse();
  };
  for (int w : {1, 3}) ASSERT_TRUE(workers[w]->Pull(absl::MakeSpan(values)).ok());
  v1::StatsResponse held = stats();
  EXPECT_EQ(held.shm_segments(), 2);
  EXPECT_EQ(held.data_plane_connections(), 2);
  EXPECT_EQ(held.pull_views(), 4);
  EXPECT_EQ(held.workers_released(), 0);

  // Worker 0 (shared memory) and 2 (data plane) leave: their share is freed at once.
  ASSERT_TRUE(workers[0]->Leave(absl::Seconds(5)).ok());
  ASSERT_TRUE(workers[2]->Leave(absl::Seconds(5)).ok());
  // A connection ends on its own thread, a moment after its release.
  v1::StatsResponse left;
  for (absl::Time end = absl::Now() + absl::Seconds(30); absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(20))) {
    left = stats();
    if (left.data_plane_connections() <= 1) break;
  }
  EXPECT_EQ(left.shm_segments(), 1);
  EXPECT_EQ(left.data_plane_connections(), 1);
  EXPECT_EQ(left.pull_views(), 2);
  EXPECT_EQ(left.workers_released(), 2);

  // Workers 1 and 3 go silent: once their leases expired, the same is freed for them.
  v1::StatsResponse expired;
  for (absl::Time end = absl::Now() + absl::Seconds(60); absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(50))) {
    expired = stats();
    if (expired.workers_released() >= 4 && expired.data_plane_connections() == 0) break;
  }
  EXPECT_EQ(expired.workers_released(), 4);
  EXPECT_EQ(expired.shm_segments(), 0);
  EXPECT_EQ(expired.data_plane_connections(), 0);
  EXPECT_EQ(expired.pull_views(), 0);

  // A worker whose resources were freed goes on: its push finds its segment gone, goes over gRPC
  // at once, and a later one through shared memory again (attached anew).
  const std::vector<float> gradient(model.total_params, 0.0f);
  ASSERT_TRUE(workers[1]->Push(gradient).ok());
  for (absl::Time end = absl::Now() + absl::Seconds(30);
       stats().shm_segments() < 1 && absl::Now() < end;) {
    ASSERT_TRUE(workers[1]->Push(gradient).ok());
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(stats().shm_segments(), 1);
  const int64_t through_shared = stats().shm_pushes();
  ASSERT_TRUE(workers[1]->Push(gradient).ok());
  EXPECT_EQ(stats().shm_pushes(), through_shared + 1);
}

}  // namespace
}  // namespace ps
