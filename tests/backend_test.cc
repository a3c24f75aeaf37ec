// What --device means, parsed and resolved without touching a GPU.
#include "kernels/backend.h"

#include <gtest/gtest.h>

#include "tests/scoped_env.h"

namespace ps {
namespace {

TEST(BackendTest, DeviceNamesParse) {
  EXPECT_EQ(ParseDevice("cpu")->kind, DeviceRequest::kCpu);
  EXPECT_EQ(ParseDevice("auto")->kind, DeviceRequest::kAuto);
  EXPECT_EQ(ParseDevice("cuda")->kind, DeviceRequest::kCuda);
  EXPECT_EQ(ParseDevice("cuda")->index, -1);
  EXPECT_EQ(ParseDevice("cuda:3")->index, 3);
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:x", "CPU", ""}) {
    absl::StatusOr<DeviceRequest> request = ParseDevice(bad);
    ASSERT_FALSE(request.ok()) << bad;
    EXPECT_NE(std::string(request.status().message()).find("expected auto, cpu, cuda or cuda:N"),
              std::string::npos);
  }
}

TEST(BackendTest, LocalRankComesFromTheEnvironmentElseTheRank) {
  {
    ScopedEnv env("LOCAL_RANK", "3");
    EXPECT_EQ(LocalRank(5), 3);
  }
  for (const char* unusable : {"", "x", "-2"}) {
    ScopedEnv env("LOCAL_RANK", unusable);
    EXPECT_EQ(LocalRank(5), 5) << "LOCAL_RANK='" << unusable << "'";
  }
}

TEST(BackendTest, CpuIsAlwaysThere) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend("cpu", 1);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->Name(), "cpu");
  EXPECT_FALSE(MakeBackend("tpu", 1).ok());
}

}  // namespace
}  // namespace ps
