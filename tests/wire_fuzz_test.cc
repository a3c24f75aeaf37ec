// The wire fuzzer, bounded: 2,000 malformed requests to a live shard process (a ps started by
// LocalCluster). The full run (10,000 and more) is the wire_fuzz command; see bench/RESULTS.md.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <iostream>

#include "tests/fuzz/wire_fuzzer.h"

namespace ps {
namespace {

TEST(WireFuzzTest, MalformedRequestsGetProperAnswersAndChangeNoWeight) {
  std::string pattern = ::testing::TempDir() + "/wire-fuzz-XXXXXX";
  LocalCluster cluster(ExecutableDir(), mkdtemp(pattern.data()));
  absl::StatusOr<FuzzTarget> target = StartFuzzCluster(cluster, 20000);
  ASSERT_TRUE(target.ok()) << target.status();
  FuzzOptions options;
  options.requests = 2000;
  options.seed = 1;
  absl::StatusOr<FuzzReport> report = RunWireFuzz(*target, options);
  ASSERT_TRUE(report.ok()) << report.status();
  std::cout << report->Table() << report->Summary();

  EXPECT_TRUE(cluster.shards()[target->shard].running())
      << "the shard crashed; its log is in " << cluster.run_dir();
  EXPECT_EQ(report->hangs, 0) << "calls that did not return by their deadline + slack";
  EXPECT_EQ(report->Count(grpc::StatusCode::DEADLINE_EXCEEDED), 0) << "requests left unanswered";
  EXPECT_EQ(report->Count(grpc::StatusCode::INTERNAL), 0) << "a malformed request is the client's "
                                                             "fault, not an internal error";
  EXPECT_EQ(report->Count(grpc::StatusCode::UNKNOWN), 0);
  EXPECT_EQ(report->accepted_writes, 0) << "invalid pushes that the shard applied";
  EXPECT_TRUE(report->weights_identical) << report->weights_detail;
  EXPECT_EQ(cluster.Stop(), "");  // both shards still exit 0 on SIGTERM
}

}  // namespace
}  // namespace ps
