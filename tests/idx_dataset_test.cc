#include "trainer/idx_dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <fstream>
#include <string>
#include <vector>

namespace ps {
namespace {

// A file name of this test's own: ctest runs the tests of this binary as parallel processes.
std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/" +
         ::testing::UnitTest::GetInstance()->current_test_info()->name() + "-" +
         std::to_string(getpid()) + "-" + name;
}

// IDX bytes: magic 0 0 8 rank, big-endian dims, payload.
std::string Idx(std::vector<int> dims, const std::vector<uint8_t>& payload) {
  std::string b = {0, 0, 8, static_cast<char>(dims.size())};
  for (int d : dims) {
    for (int shift : {24, 16, 8, 0}) b.push_back(static_cast<char>((d >> shift) & 0xff));
  }
  b.append(payload.begin(), payload.end());
  return b;
}

void WritePlain(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

void WriteGzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), bytes.size());
  gzclose(f);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Two 2x2 images and their labels.
void WriteTinyDataset(const std::string& images, const std::string& labels, bool gzip) {
  auto write = gzip ? WriteGzip : WritePlain;
  write(images, Idx({2, 2, 2}, {0, 255, 51, 102, 1, 2, 3, 4}));
  write(labels, Idx({2}, {7, 3}));
}

TEST(IdxDatasetTest, ReadsPlainAndGzipFiles) {
  for (bool gzip : {false, true}) {
    std::string images = TempPath("img"), labels = TempPath("lab");
    WriteTinyDataset(images, labels, gzip);
    absl::StatusOr<Examples> ex = LoadIdxExamples(images, labels, 10);
    ASSERT_TRUE(ex.ok()) << ex.status();
    EXPECT_EQ(ex->count, 2);
    EXPECT_EQ(ex->num_features, 4);
    EXPECT_FLOAT_EQ(ex->features[1], 1.0f);
    EXPECT_FLOAT_EQ(ex->features[2], 0.2f);
    EXPECT_EQ(ex->labels, (std::vector<int32_t>{7, 3}));
  }
}

TEST(IdxDatasetTest, LoadsASlice) {
  std::string images = TempPath("img"), labels = TempPath("lab");
  WriteTinyDataset(images, labels, true);
  Range second{1, 2};
  absl::StatusOr<Examples> ex = LoadIdxExamples(images, labels, 10, &second);
  ASSERT_TRUE(ex.ok()) << ex.status();
  EXPECT_EQ(ex->count, 1);
  EXPECT_EQ(ex->labels[0], 3);
  EXPECT_FLOAT_EQ(ex->features[0], 1 / 255.0f);
  Range outside{1, 3};
  EXPECT_EQ(LoadIdxExamples(images, labels, 10, &outside).status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST(IdxDatasetTest, TruncatedPayloadIsAClearError) {
  std::string path = TempPath("short");
  WritePlain(path, Idx({2, 2, 2}, {1, 2, 3}));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path, 3);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(a.status().message().find("truncated"), std::string::npos) << a.status();
  EXPECT_NE(a.status().message().find(path), std::string::npos);
}

TEST(IdxDatasetTest, TruncatedGzipIsAClearError) {
  std::string full = TempPath("full.gz"), cut = TempPath("cut.gz");
  WriteGzip(full, Idx({100, 28, 28}, std::vector<uint8_t>(100 * 28 * 28, 7)));
  std::string bytes = ReadAll(full);
  WritePlain(cut, bytes.substr(0, bytes.size() / 2));
  absl::StatusOr<IdxArray> a = ReadIdxFile(cut, 3);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss) << a.status();
}

TEST(IdxDatasetTest, CorruptGzipIsAClearError) {
  std::string full = TempPath("full.gz"), bad = TempPath("bad.gz");
  WriteGzip(full, Idx({100, 28, 28}, std::vector<uint8_t>(100 * 28 * 28, 7)));
  std::string bytes = ReadAll(full);
  for (size_t i = 20; i < bytes.size() - 10; i += 7) bytes[i] ^= 0x5a;
  WritePlain(bad, bytes);
  EXPECT_EQ(ReadIdxFile(bad, 3).status().code(), absl::StatusCode::kDataLoss);
}

TEST(IdxDatasetTest, BadHeadersAreRejected) {
  std::string path = TempPath("hdr");
  WritePlain(path, "PK\x03\x04 not idx");
  EXPECT_NE(ReadIdxFile(path, 3).status().message().find("bad magic"), std::string::npos);
  WritePlain(path, Idx({4}, {1, 2, 3, 4}));
  EXPECT_NE(ReadIdxFile(path, 3).status().message().find("rank 1, expected 3"), std::string::npos);
  std::string floats = Idx({1}, {0, 0, 0, 0});
  floats[2] = 0x0d;
  WritePlain(path, floats);
  EXPECT_NE(ReadIdxFile(path, 1).status().message().find("element type"), std::string::npos);
  WritePlain(path, Idx({2}, {1, 2, 3}));
  EXPECT_NE(ReadIdxFile(path, 1).status().message().find("trailing"), std::string::npos);
}

TEST(IdxDatasetTest, MissingFileIsNotFound) {
  absl::StatusOr<IdxArray> a = ReadIdxFile("/nonexistent/train-images-idx3-ubyte.gz", 3);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(a.status().message().find("/nonexistent/"), std::string::npos);
}

TEST(IdxDatasetTest, CountMismatchAndBadLabelsAreRejected) {
  std::string images = TempPath("img"), labels = TempPath("lab");
  WritePlain(images, Idx({2, 1, 1}, {1, 2}));
  WritePlain(labels, Idx({3}, {1, 2, 3}));
  EXPECT_NE(LoadIdxExamples(images, labels, 10).status().message().find("has 2 images but"),
            std::string::npos);
  WritePlain(labels, Idx({2}, {1, 12}));
  EXPECT_NE(LoadIdxExamples(images, labels, 10).status().message().find("label 12"),
            std::string::npos);
}

TEST(IdxDatasetTest, RealFashionMnistTestSplit) {
  absl::StatusOr<Examples> ex = LoadFashionMnist("/usr/share/datasets/fashion-mnist", "t10k");
  ASSERT_TRUE(ex.ok()) << ex.status() << " (is dataset-fashion-mnist installed?)";
  EXPECT_EQ(ex->count, 10000);
  EXPECT_EQ(ex->num_features, 784);
  std::vector<int> per_class(10);
  for (int32_t l : ex->labels) ++per_class[l];
  for (int c : per_class) EXPECT_EQ(c, 1000);  // the test split is balanced
}

}  // namespace
}  // namespace ps
