// A job across hosts, on one machine: Linux network namespaces, one per shard, worker and the
// evaluator, each with its own address on a bridge, each host's link limited to 1 Gbit/s, delayed
// 2 ms +- 1 ms and losing 0.1% of its packets (tests/netns/virtual_hosts.h). Every daemon starts
// from one cluster spec with its role; the same job with workers that overlap communication with
// compute, and with each push compressor. Skips, saying why, where namespaces cannot be made or
// links shaped (not root, no iproute2 or iptables, no netdelay).
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/compression.h"
#include "deploy/subprocess.h"
#include "proto/ps.pb.h"
#include "tests/netns/virtual_hosts.h"
#include "tests/run_dir.h"

namespace ps {
namespace {

// Two shards, two workers and the evaluator on five hosts, from one spec with a token (shards
// listen on their hosts' addresses), the workers' section given `worker_settings` too, their
// pushes compressed with `compress` ("none": not) and their pulls with `pull_compress` ("": not):
// the job trains to `bar`, every update and pull crossed the links (compressed, when it was), and
// every daemon exits 0 on SIGTERM.
void TrainAcrossHosts(const std::string& worker_settings, const std::string& compress, double bar,
                      const std::string& pull_compress = "") {
  const std::string dir = NewRunDir("hosts");
  const LinkShape shape{.rate_gbit = 1, .delay_ms = 2, .jitter_ms = 1, .loss = 0.001};
  absl::StatusOr<std::unique_ptr<VirtualHosts>> made =
      VirtualHosts::Create(5, shape, ExecutableDir() + "/netdelay", dir);
  if (made.status().code() == absl::StatusCode::kFailedPrecondition) {
    GTEST_SKIP() << "cannot emulate hosts here: " << made.status();
  }
  ASSERT_TRUE(made.ok()) << made.status();
  const VirtualHosts& hosts = **made;
  std::cout << "links: " << shape.Describe() << "\n";
  std::ofstream(dir + "/token") << "multi-host-test-token-0123456789\n";
  const std::string spec = dir + "/cluster.json";
  std::ofstream(spec) << absl::StrCat(R"({"hidden": "128,64", "workers": 2, "shards": [")",
                                      hosts.Address(0), R"(:50051", ")", hosts.Address(1),
                                      R"(:50051"],
      "ps": {"optimizer": "momentum", "lr": 0.01},
      "worker": {"steps": 700, "device": "cpu", "shared_memory": false, "retry_seconds": 120,
                 "compress": ")",
                                      compress, R"(")", worker_settings,
                                      pull_compress.empty()
                                          ? ""
                                          : absl::StrCat(R"(, "pull_compress": ")", pull_compress,
                                                         R"(")"),
                                      R"(},
      "evaluator": {"interval_seconds": 1, "shared_memory": false},
      "security": {"token_file": ")",
                                      dir, R"(/token"}})");
  auto start = [&](int host, const std::string& program, const std::string& role) {
    std::vector<std::string> argv = {ExecutableDir() + "/" + program, "--cluster=" + spec,
                                     "--role=" + role};
    argv.push_back(program == "ps" ? absl::StrCat("--stats_json=", dir, "/ps-", host, "-stats.json")
                                   : absl::StrCat("--csv=", dir, "/", program, "-", host, ".csv"));
    absl::StatusOr<Subprocess> p =
        Subprocess::Start(hosts.On(host, argv), absl::StrCat(dir, "/", program, "-", host, ".log"));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : Subprocess();
  };
  Subprocess ps0 = start(0, "ps", "ps:0"), ps1 = start(1, "ps", "ps:1");
  Subprocess w0 = start(2, "worker", "worker:0"), w1 = start(3, "worker", "worker:1");
  Subprocess evaluator = start(4, "evaluator", "evaluator");
  for (auto [w, host] : {std::pair{&w0, 2}, std::pair{&w1, 3}}) {
    absl::StatusOr<int> code = w->Wait(absl::Minutes(5));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0) << ReadFile(absl::StrCat(dir, "/worker-", host, ".log"));
    // A step waits for a round trip, 2 x (2 +- 1) ms at least: the latency was really there. (A
    // pull, or with a prefetched pull that waits no more, the push.)
    std::vector<std::string> steps = absl::StrSplit(
        ReadFile(absl::StrCat(dir, "/worker-", host, ".csv")), '\n', absl::SkipEmpty());
    ASSERT_EQ(steps.size(), 701u) << "a header and 700 steps";
    double fastest = 1e9;
    for (size_t i = 1; i < steps.size(); ++i) {
      fastest = std::min(fastest, Column(steps[i], 7) + Column(steps[i], 9));
    }
    std::cout << "worker " << host - 2 << ": fastest pull + push " << fastest << " ms\n";
    EXPECT_GE(fastest, 2.0);
  }
  // Each shard received every push of its half of the model over its link: 1,400 x its part,
  // as float32 or compressed (then at least 3x fewer bytes than float32's), and sent every pull
  // (with `pull_compress`, compressed after each worker's first).
  const int64_t params = 784 * 128 + 128 + 128 * 64 + 64 + 64 * 10 + 10, part = params / 2;
  absl::StatusOr<Compression> compression = ParseCompression(compress);
  ASSERT_TRUE(compression.ok()) << compression.status();
  const int64_t push_bytes = compression->compressor == Compressor::kNone
                                 ? part * 4
                                 : CompressedBytes(compression->compressor, part,
                                                   std::llround(compression->topk_fraction * part));
  for (int shard = 0; shard < 2; ++shard) {
    const int64_t received = hosts.ReceivedBytes(shard);
    std::cout << "shard " << shard << " received " << received << " bytes\n";
    EXPECT_GE(received, 1400 * push_bytes) << "the pushes did not cross the link";
    if (compression->compressor != Compressor::kNone) {
      EXPECT_LT(received, 1400 * part * 4 / 3) << "the pushes were not compressed";
    }
    const int64_t sent = hosts.SentBytes(shard);
    std::cout << "shard " << shard << " sent " << sent << " bytes\n";
    if (pull_compress.empty()) {
      EXPECT_GE(sent, 1400 * part * 4) << "the pulls did not cross the link";
    } else {
      absl::StatusOr<Compression> c = ParseCompression(pull_compress);
      ASSERT_TRUE(c.ok()) << c.status();
      EXPECT_GE(sent, 1400 * CompressedBytes(c->compressor, part, 0)) << "no pulls crossed";
      EXPECT_LT(sent, 1400 * part * 4 / 3) << "the pulls were not compressed";
    }
  }
  EXPECT_EQ(evaluator.Stop(absl::Seconds(10)), 0) << ReadFile(dir + "/evaluator-4.log");
  EXPECT_EQ(ps0.Stop(absl::Seconds(10)), 0);
  EXPECT_EQ(ps1.Stop(absl::Seconds(10)), 0);
  // The tensors took the data plane across the links: every float32 push (compressed ones go over
  // gRPC), and every pull of the workers and the evaluator that was not compressed.
  for (int shard = 0; shard < 2; ++shard) {
    const std::string json = ReadFile(absl::StrCat(dir, "/ps-", shard, "-stats.json"));
    v1::StatsResponse stats;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &stats).ok()) << json;
    std::cout << "shard " << shard << ": " << stats.data_plane_pushes() << " pushes and "
              << stats.data_plane_pulls() << " pulls over the data plane\n";
    EXPECT_EQ(stats.pushes_applied(), 1400);
    EXPECT_EQ(stats.data_plane_pushes(), compression->compressor == Compressor::kNone ? 1400 : 0);
    if (pull_compress.empty()) {
      EXPECT_GE(stats.data_plane_pulls(), 1400);
    }
  }
  const std::string csv = ReadFile(dir + "/evaluator-4.csv");
  std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  ASSERT_GE(lines.size(), 2u) << csv;
  std::cout << "final: " << lines.back() << "\n";
  EXPECT_EQ(Column(lines.back(), 1), 1400) << "the evaluator scores the final weights";
  EXPECT_GE(Column(lines.back(), 3), bar) << lines.back();
}

// ClusterTest's bar for the same job.
TEST(MultiHostTest, AJobAcrossNamespacesTrainsFromOneSpec) { TrainAcrossHosts("", "none", 0.75); }

// Each step's pull and push overlapping its compute (layer by layer, and the next step's pull
// prefetched): ClusterTest's bar for prefetching workers.
TEST(MultiHostTest, WorkersOverlappingCommunicationWithComputeTrainAcrossHosts) {
  TrainAcrossHosts(R"(, "overlap": true, "prefetch": true)", "none", 0.75);
}

// Each compressor, with error feedback: CompressedTrainingTest's bar.
TEST(MultiHostTest, OneBitPushesTrainAcrossHosts) { TrainAcrossHosts("", "onebit", 0.72); }
TEST(MultiHostTest, TopKPushesTrainAcrossHosts) { TrainAcrossHosts("", "topk:0.01", 0.72); }
TEST(MultiHostTest, Int8PushesAndPullsTrainAcrossHosts) {
  TrainAcrossHosts("", "int8", 0.72, "int8");
}

}  // namespace
}  // namespace ps
