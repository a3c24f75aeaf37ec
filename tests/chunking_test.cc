#include "common/chunking.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

namespace ps {
namespace {

TEST(ChunkingTest, RoundTripsEveryLengthAroundTheChunkSize) {
  for (int64_t n : {int64_t{0}, int64_t{1}, kChunkFloats - 1, kChunkFloats, kChunkFloats + 1,
                    kChunkFloats * 5 / 2}) {
    std::vector<float> in(n);
    std::iota(in.begin(), in.end(), 0.5f);
    std::vector<std::string> wire;
    int64_t expected_index = 0;
    ForEachChunk(in, kChunkFloats, [&](int64_t index, std::string_view bytes) {
      EXPECT_EQ(index, expected_index);
      EXPECT_LE(static_cast<int64_t>(bytes.size()), kChunkBytes);
      expected_index += bytes.size() / sizeof(float);
      wire.emplace_back(bytes);
    });
    EXPECT_EQ(static_cast<int64_t>(wire.size()),
              std::max<int64_t>(1, (n + kChunkFloats - 1) / kChunkFloats));
    std::vector<float> out(n, -1.0f);
    ChunkAssembler assembler(absl::MakeSpan(out));
    for (const std::string& w : wire) ASSERT_TRUE(assembler.Append(w).ok());
    ASSERT_TRUE(assembler.Finish().ok());
    EXPECT_EQ(in, out) << "n=" << n;
  }
}

TEST(ChunkingTest, SmallChunkSizeSplitsExactly) {
  std::vector<float> in = {1, 2, 3, 4, 5};
  std::vector<int64_t> sizes;
  ForEachChunk(in, 2, [&](int64_t, std::string_view b) { sizes.push_back(b.size() / 4); });
  EXPECT_EQ(sizes, (std::vector<int64_t>{2, 2, 1}));
}

TEST(ChunkAssemblerTest, RejectsPartialFloats) {
  std::vector<float> out(4);
  ChunkAssembler a(absl::MakeSpan(out));
  absl::Status s = a.Append(std::string(7, '\0'));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not a whole number"), std::string::npos) << s;
}

TEST(ChunkAssemblerTest, RejectsOverrunWithoutWriting) {
  std::vector<float> out(2, 9.0f);
  ChunkAssembler a(absl::MakeSpan(out));
  std::vector<float> three = {1, 2, 3};
  absl::Status s = a.Append(AsBytes(three));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overruns"), std::string::npos) << s;
  EXPECT_EQ(out, (std::vector<float>{9.0f, 9.0f}));
}

TEST(ChunkAssemblerTest, FinishReportsTruncation) {
  std::vector<float> out(3);
  ChunkAssembler a(absl::MakeSpan(out));
  std::vector<float> two = {1, 2};
  ASSERT_TRUE(a.Append(AsBytes(two)).ok());
  absl::Status s = a.Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("got 2 values, declared 3"), std::string::npos) << s;
}

}  // namespace
}  // namespace ps
