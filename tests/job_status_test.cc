// psctl's table (tools/job_status.h) from statistics made up here.
#include "tools/job_status.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ps {
namespace {

v1::StatsResponse Shard(int index, int64_t version, std::vector<int64_t> staleness) {
  v1::StatsResponse s;
  s.set_shard_index(index);
  s.set_version(version);
  s.set_active_workers(2);
  s.set_registered_workers(3);
  s.set_pushes_dropped_stale(4);
  s.set_pushes_dropped_late(1);
  s.set_pushes_rejected(7);
  for (int64_t c : staleness) s.add_staleness_counts(c);
  return s;
}

TEST(JobStatusTest, StalenessQuantilesFromTheHistogram) {
  v1::StatsResponse s = Shard(0, 0, {10, 80, 9, 1});  // 100 pushes: staleness 0..3
  EXPECT_EQ(StalenessQuantile(s, 0.05), 0);
  EXPECT_EQ(StalenessQuantile(s, 0.5), 1);
  EXPECT_EQ(StalenessQuantile(s, 0.99), 2);
  EXPECT_EQ(StalenessQuantile(s, 1.0), 3);
  EXPECT_EQ(StalenessQuantile(Shard(0, 0, {}), 0.5), -1);  // nothing applied yet
}

TEST(JobStatusTest, OneRowPerShardAndPerWorkerWithRates) {
  std::vector<v1::StatsResponse> before = {Shard(0, 100, {}), Shard(1, 100, {})};
  std::vector<v1::StatsResponse> now = {Shard(0, 350, {10, 80, 9, 1}), Shard(1, 150, {})};
  now[1].set_replica_role("primary");
  v1::WorkerStats* w = now[0].add_workers();
  w->set_worker_id(2);
  w->set_active(true);
  w->set_clock(41);
  w->set_seconds_since_seen(0.25);
  w->set_pushes_applied(40);
  const std::string table = StatusTable({"a:1", "b:2"}, now, &before, 2.0);
  EXPECT_NE(table.find("a:1"), std::string::npos) << table;
  EXPECT_NE(table.find("125.0"), std::string::npos) << table;   // (350 - 100) / 2 s
  EXPECT_NE(table.find("  25.0"), std::string::npos) << table;  // (150 - 100) / 2 s
  EXPECT_NE(table.find("primary"), std::string::npos) << table;
  EXPECT_NE(table.find("2/3"), std::string::npos) << table;
  EXPECT_NE(table.find("yes"), std::string::npos) << table;
  const std::string once = StatusTable({"a:1", "b:2"}, now, nullptr, 0);
  EXPECT_EQ(once.find("125.0"), std::string::npos) << once;       // no rate from one reading
  EXPECT_EQ(once.find("checkpoint"), std::string::npos) << once;  // none failed
}

TEST(JobStatusTest, AShardWhoseCheckpointsFailedSaysSo) {
  std::vector<v1::StatsResponse> now = {Shard(0, 350, {}), Shard(1, 150, {})};
  now[1].set_checkpoint_failures(3);
  now[1].set_checkpoint_last_error("cannot create /ckpt/shard-1-000000000150.safetensors.tmp");
  now[1].set_checkpoint_last_written_version(100);
  now[1].set_checkpoint_last_written_time(1'800'000'000);
  const std::string table = StatusTable({"a:1", "b:2"}, now, nullptr, 0);
  EXPECT_NE(table.find("shard 1: 3 checkpoint(s) FAILED, the last: cannot create "
                       "/ckpt/shard-1-000000000150.safetensors.tmp; the newest written holds "
                       "version 100 (2027-01-15 08:00:00 UTC)"),
            std::string::npos)
      << table;
  EXPECT_EQ(table.find("shard 0:"), std::string::npos) << table;
  now[1].set_checkpoint_last_written_version(-1);
  EXPECT_NE(StatusTable({"a:1", "b:2"}, now, nullptr, 0).find("none written since the shard"),
            std::string::npos);
}

TEST(JobStatusTest, ShardProcessesOfDifferentBuildsAreFlagged) {
  std::vector<v1::StatsResponse> now = {Shard(0, 1, {}), Shard(1, 1, {}), Shard(1, 1, {})};
  for (v1::StatsResponse& s : now) {
    s.set_version_line("paramserver 1.3.0 (3a22abf, Release, CUDA on)");
  }
  now[2].set_replica_role("down");
  now[2].clear_version_line();
  std::string table = StatusTable({"a:1", "b:2", "c:3"}, now, nullptr, 0);
  EXPECT_NE(table.find("build: paramserver 1.3.0 (3a22abf, Release, CUDA on)\n"),
            std::string::npos)
      << table;  // the one that is down runs nothing
  EXPECT_EQ(table.find("WARNING"), std::string::npos) << table;
  now[1].set_version_line("paramserver 1.3.1 (5b6c7d8, Debug, CUDA off)");
  now[2].set_replica_role("backup");
  table = StatusTable({"a:1", "b:2", "c:3"}, now, nullptr, 0);
  EXPECT_NE(table.find("WARNING: the shard processes run different builds:\n"
                       "  shard 0 (a:1): paramserver 1.3.0 (3a22abf, Release, CUDA on)\n"
                       "  shard 1 (b:2): paramserver 1.3.1 (5b6c7d8, Debug, CUDA off)\n"
                       "  shard 1 (c:3): unknown (an older release)\n"),
            std::string::npos)
      << table;
  EXPECT_EQ(table.find("build: "), std::string::npos) << table;
}

}  // namespace
}  // namespace ps
