// Push compression: the codecs' round trips and exact lengths, malformed payloads refused,
// chunking at whole units, and error feedback's residual against hand-computed values.
#include "common/compression.h"

#include <gtest/gtest.h>

#include <grpcpp/support/byte_buffer.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "transport/chunking.h"
#include "transport/tensor_codec.h"
#include "proto/ps.pb.h"
#include "client/push_compressor.h"

namespace ps {
namespace {

const Compression kOneBit{Compressor::kOneBit};
const Compression kInt8{Compressor::kInt8};
const Compression kTopK1{Compressor::kTopK, 0.01};

std::vector<float> RandomValues(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

PayloadFormat FormatOf(const CompressedTensor& c) {
  return PayloadFormat{WireType::kFloat32, c.compressor, c.pairs};
}

// Decodes `c` (n values) through a ChunkAssembler, fed in pieces of whole units.
absl::StatusOr<std::vector<float>> Decode(const CompressedTensor& c, int64_t n) {
  std::vector<float> out(n, -7.0f);
  ChunkAssembler assembler(absl::MakeSpan(out), FormatOf(c));
  absl::Status s;
  ForEachUnitChunk(c.bytes, CompressedUnitBytes(c.compressor), [&](std::string_view piece) {
    if (s.ok()) s = assembler.Append(piece);
  });
  if (s.ok()) s = assembler.Finish();
  if (!s.ok()) return s;
  return out;
}

TEST(CompressionTest, ParsesNamesAndRefusesOthers) {
  EXPECT_EQ(ParseCompression("none")->compressor, Compressor::kNone);
  EXPECT_EQ(ParseCompression("onebit")->compressor, Compressor::kOneBit);
  EXPECT_EQ(ParseCompression("int8")->compressor, Compressor::kInt8);
  absl::StatusOr<Compression> topk = ParseCompression("topk:0.01");
  ASSERT_TRUE(topk.ok());
  EXPECT_EQ(topk->compressor, Compressor::kTopK);
  EXPECT_DOUBLE_EQ(topk->topk_fraction, 0.01);
  EXPECT_EQ(CompressionName(*topk), "topk:0.01");
  for (const char* bad : {"", "topk", "topk:0", "topk:1.5", "topk:x", "int4", "fp32"}) {
    absl::StatusOr<Compression> c = ParseCompression(bad);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(ParseCompression("int4").status().message().find("onebit, int8 or topk:F"),
            std::string::npos);
}

// Every length around a block: the exact byte count, and decode(c) + residual = the values.
TEST(CompressionTest, RoundTripsWithExactLengths) {
  for (const Compression& c : {kOneBit, kInt8, Compression{Compressor::kTopK, 0.1}}) {
    for (int64_t n : {0, 1, 7, 8, 9, 255, 256, 257, 1000, 5000}) {
      const std::vector<float> in = RandomValues(n, 7);
      std::vector<float> residual = in;
      CompressedTensor out;
      Compress(c, absl::MakeSpan(residual), &out);
      const int64_t pairs = c.compressor == Compressor::kTopK && n > 0
                                ? std::max<int64_t>(1, std::llround(0.1 * n))
                                : 0;
      EXPECT_EQ(out.pairs, pairs);
      const int64_t blocks = (n + 255) / 256;
      const int64_t expected = c.compressor == Compressor::kOneBit ? 4 * blocks + (n / 256) * 32 +
                                                                         (n % 256 + 7) / 8
                               : c.compressor == Compressor::kInt8 ? 4 * blocks + n
                                                                   : 8 * pairs;
      EXPECT_EQ(static_cast<int64_t>(out.bytes.size()), expected) << CompressionName(c) << n;
      EXPECT_EQ(PayloadBytes(FormatOf(out), n), expected);
      absl::StatusOr<std::vector<float>> decoded = Decode(out, n);
      ASSERT_TRUE(decoded.ok()) << decoded.status() << " " << CompressionName(c) << " n=" << n;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR((*decoded)[i] + residual[i], in[i], 1e-5) << CompressionName(c) << i;
      }
    }
  }
  EXPECT_EQ(CompressedBytes(Compressor::kOneBit, 257, 0), 36 + 5);
  EXPECT_EQ(CompressedBytes(Compressor::kInt8, 257, 0), 260 + 5);
  EXPECT_EQ(CompressedBytes(Compressor::kTopK, 1000, 10), 80);
}

TEST(CompressionTest, EachCodecDecodesWhatItPromises) {
  const std::vector<float> in = RandomValues(1000, 3);
  std::vector<float> rest = in;
  CompressedTensor out;
  Compress(kOneBit, absl::MakeSpan(rest), &out);
  std::vector<float> d = *Decode(out, 1000);
  for (int64_t b = 0; b < 1000; b += 256) {  // +-(the block's mean |value|), the value's sign
    double sum = 0;
    for (int64_t i = b; i < std::min<int64_t>(b + 256, 1000); ++i) sum += std::fabs(in[i]);
    const float scale = static_cast<float>(sum / std::min<int64_t>(256, 1000 - b));
    for (int64_t i = b; i < std::min<int64_t>(b + 256, 1000); ++i) {
      ASSERT_EQ(d[i], in[i] < 0 ? -scale : scale);
    }
  }
  rest = in;
  Compress(kInt8, absl::MakeSpan(rest), &out);
  d = *Decode(out, 1000);
  for (int64_t i = 0; i < 1000; ++i) {
    float max = 0;
    for (int64_t j = i / 256 * 256; j < std::min<int64_t>(i / 256 * 256 + 256, 1000); ++j) {
      max = std::max(max, std::fabs(in[j]));
    }
    ASSERT_LE(std::fabs(d[i] - in[i]), max / 127 / 2 * 1.0001f) << i;  // half a step at most
  }
  rest = in;
  Compress(kTopK1, absl::MakeSpan(rest), &out);
  d = *Decode(out, 1000);
  int nonzero = 0;
  float smallest_sent = std::numeric_limits<float>::infinity(), largest_left = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    if (d[i] != 0) {
      ++nonzero;
      EXPECT_EQ(d[i], in[i]);
      smallest_sent = std::min(smallest_sent, std::fabs(in[i]));
    } else {
      largest_left = std::max(largest_left, std::fabs(in[i]));
    }
  }
  EXPECT_EQ(nonzero, 10);
  EXPECT_GT(smallest_sent, largest_left);
}

// Ties in magnitude go to the lower index, and exactly k pairs are sent.
TEST(CompressionTest, TopKBreaksTiesByIndex) {
  std::vector<float> v = {1, -2, 2, 0.5f, -2, 2};
  CompressedTensor out;
  Compress(Compression{Compressor::kTopK, 0.5}, absl::MakeSpan(v), &out);
  ASSERT_EQ(out.pairs, 3);
  EXPECT_EQ(*Decode(out, 6), (std::vector<float>{0, -2, 2, 0, -2, 0}));
  EXPECT_EQ(v, (std::vector<float>{1, 0, 0, 0.5f, 0, 2}));
}

// A block of values too small for a scale (1 / scale would overflow) goes as zeros and stays in
// the residual; a non-finite value makes its block's scale non-finite, which a shard refuses.
TEST(CompressionTest, Int8SendsTinyBlocksAsZerosAndNonFiniteOnesAsRefusable) {
  std::vector<float> v = {1e-39f, -2e-39f, 0, 3e-40f};
  const std::vector<float> in = v;
  CompressedTensor out;
  Compress(kInt8, absl::MakeSpan(v), &out);
  EXPECT_EQ(*Decode(out, 4), std::vector<float>(4, 0.0f));
  EXPECT_EQ(v, in);
  for (const Compression& c : {kInt8, kOneBit}) {
    std::vector<float> bad = {1, std::numeric_limits<float>::quiet_NaN(), 2, 3};
    Compress(c, absl::MakeSpan(bad), &out);
    EXPECT_NE(Decode(out, 4).status().message().find("has scale nan"), std::string::npos)
        << CompressionName(c);
  }
}

// A payload of `values` compressed by `c`, as the shard would get it, with bytes changed.
struct Refusal {
  std::string what;
  Compressor compressor;
  int64_t pairs;
  std::string bytes;
  std::string message;  // expected in the error
};

std::string PutFloat(std::string bytes, size_t at, float f) {
  std::memcpy(bytes.data() + at, &f, sizeof(f));
  return bytes;
}

std::string Pair(uint32_t index, float value) {
  std::string p(8, '\0');
  std::memcpy(p.data(), &index, 4);
  std::memcpy(p.data() + 4, &value, 4);
  return p;
}

TEST(CompressedDecoderTest, RefusesMalformedPayloadsNamingTheProblemAndWritesNothing) {
  std::vector<float> values = RandomValues(300, 5);  // a block of 256 and one of 44
  CompressedTensor onebit, int8;
  std::vector<float> scratch = values;
  Compress(kOneBit, absl::MakeSpan(scratch), &onebit);
  scratch = values;
  Compress(kInt8, absl::MakeSpan(scratch), &int8);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<Refusal> refusals = {
      {"onebit truncated", Compressor::kOneBit, 0, onebit.bytes.substr(0, onebit.bytes.size() - 1),
       "truncated block"},
      {"onebit one byte more", Compressor::kOneBit, 0, onebit.bytes + "x",
       "overruns the declared length"},
      {"onebit a block more", Compressor::kOneBit, 0, onebit.bytes + onebit.bytes.substr(0, 36),
       "overruns the declared length"},
      {"onebit NaN scale", Compressor::kOneBit, 0, PutFloat(onebit.bytes, 36, nan),
       "values [256, 300) has scale nan"},
      {"onebit negative scale", Compressor::kOneBit, 0, PutFloat(onebit.bytes, 0, -1),
       "has scale -1"},
      {"int8 Inf scale", Compressor::kInt8, 0, PutFloat(int8.bytes, 260, inf), "has scale inf"},
      {"int8 truncated", Compressor::kInt8, 0, int8.bytes.substr(0, 300), "truncated block"},
      {"top-k index out of range", Compressor::kTopK, 2, Pair(3, 1) + Pair(300, 1),
       "index 300 is out of range [0, 300)"},
      {"top-k index repeated", Compressor::kTopK, 2, Pair(3, 1) + Pair(3, 2),
       "strictly increasing"},
      {"top-k indices decreasing", Compressor::kTopK, 2, Pair(9, 1) + Pair(3, 2),
       "strictly increasing"},
      {"top-k more pairs than declared", Compressor::kTopK, 1, Pair(1, 1) + Pair(2, 1),
       "overruns the declared pairs"},
      {"top-k half a pair", Compressor::kTopK, 1, Pair(1, 1).substr(0, 5), "not whole top-k pairs"},
  };
  for (const Refusal& r : refusals) {
    std::vector<float> out(300, 42.0f);
    CompressedDecoder decoder(r.compressor, r.pairs, absl::MakeSpan(out));
    absl::Status s = decoder.Append(r.bytes);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << r.what;
    EXPECT_NE(s.message().find(r.message), std::string::npos) << r.what << ": " << s;
    for (float v : out) {
      ASSERT_EQ(v, r.compressor == Compressor::kTopK ? 0.0f : 42.0f) << r.what << ": written";
    }
  }
  // Too few: refused at the end.
  std::vector<float> out(300);
  CompressedDecoder few(Compressor::kTopK, 3, absl::MakeSpan(out));
  ASSERT_TRUE(few.Append(Pair(1, 1) + Pair(2, 1)).ok());
  EXPECT_NE(few.Finish().message().find("got 2 pairs, declared 3"), std::string::npos);
  CompressedDecoder blocks(Compressor::kInt8, 0, absl::MakeSpan(out));
  ASSERT_TRUE(blocks.Append(int8.bytes.substr(0, 260)).ok());
  EXPECT_NE(blocks.Finish().message().find("got 256 values, declared 300"), std::string::npos);
}

TEST(CompressedDecoderTest, PushHeadersAreCheckedBeforeAnyByte) {
  EXPECT_EQ(PushPayloadFormat(v1::TOPK, 11, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PushPayloadFormat(v1::TOPK, -1, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_NE(PushPayloadFormat(v1::TOPK, 1, int64_t{1} << 32).status().message().find("2^32"),
            std::string::npos);
  EXPECT_NE(PushPayloadFormat(v1::INT8, 5, 10).status().message().find("not TOPK"),
            std::string::npos);
  EXPECT_NE(PushPayloadFormat(7, 0, 10).status().message().find("unsupported dtype 7"),
            std::string::npos);
  EXPECT_FALSE(PushPayloadFormat(v1::DTYPE_UNSPECIFIED, 0, 10).ok());
  absl::StatusOr<PayloadFormat> f = PushPayloadFormat(v1::TOPK, 10, 10);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->compressor, Compressor::kTopK);
  EXPECT_EQ(PushPayloadFormat(v1::BFLOAT16, 0, 10)->type, WireType::kBFloat16);
}

// Chunks of a stream hold whole units: a payload over 1 MiB whose unit (36 bytes a onebit block)
// does not divide 1 MiB is cut where no block straddles two messages, and decodes.
TEST(CompressedDecoderTest, ChunksHoldWholeBlocksAcrossTheChunkSize) {
  const int64_t n = (kChunkBytes / 36 + 3) * 256 + 100;  // 2 chunks, the last block short
  std::vector<float> in = RandomValues(n, 11);
  std::vector<float> rest = in;
  CompressedTensor out;
  Compress(kOneBit, absl::MakeSpan(rest), &out);
  std::vector<size_t> sizes;
  ForEachUnitChunk(out.bytes, 36, [&](std::string_view piece) { sizes.push_back(piece.size()); });
  ASSERT_EQ(sizes.size(), 2u);
  EXPECT_EQ(sizes[0], static_cast<size_t>(kChunkBytes / 36 * 36));
  EXPECT_EQ(sizes[0] + sizes[1], out.bytes.size());
  absl::StatusOr<std::vector<float>> decoded = Decode(out, n);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  for (int64_t i = 0; i < n; i += 997) ASSERT_NEAR((*decoded)[i] + rest[i], in[i], 1e-5);
  // A cut inside a block (as a sender that did not align would make) is refused.
  std::vector<float> dst(n);
  ChunkAssembler assembler(absl::MakeSpan(dst), FormatOf(out));
  EXPECT_NE(assembler.Append(std::string_view(out.bytes).substr(0, kChunkBytes)).message().find(
                "truncated block"),
            std::string::npos);
}

// Within one message, gRPC may split the bytes anywhere: a block or pair across two slices is
// put together before decoding, and the short last block arrives whole.
TEST(CompressedDecoderTest, DecodesMessagesSplitAcrossSlicesAnywhere) {
  for (const Compression& c : {kOneBit, kInt8, Compression{Compressor::kTopK, 0.3}}) {
    const int64_t n = 300;
    std::vector<float> in = RandomValues(n, 13);
    CompressedTensor out;
    Compress(c, absl::MakeSpan(in), &out);
    const std::vector<float> expected = *Decode(out, n);
    v1::PushChunk message;
    message.mutable_header()->set_sequence(5);
    message.set_data(out.bytes);
    const std::string wire = message.SerializeAsString();
    for (size_t cut1 = 1; cut1 < wire.size(); cut1 += 7) {
      for (size_t cut2 = cut1 + 1; cut2 < wire.size(); cut2 += 11) {
        grpc::Slice slices[3] = {grpc::Slice(wire.data(), cut1),
                                 grpc::Slice(wire.data() + cut1, cut2 - cut1),
                                 grpc::Slice(wire.data() + cut2, wire.size() - cut2)};
        absl::StatusOr<TensorMessage> m =
            TensorMessage::Decode(grpc::ByteBuffer(slices, 3), v1::PushChunk::kDataFieldNumber);
        ASSERT_TRUE(m.ok()) << m.status();
        std::vector<float> dst(n, 9.0f);
        ChunkAssembler assembler(absl::MakeSpan(dst), FormatOf(out));
        ASSERT_TRUE(m->AppendTensorTo(&assembler).ok()) << CompressionName(c) << cut1 << cut2;
        ASSERT_TRUE(assembler.Finish().ok());
        ASSERT_EQ(dst, expected) << CompressionName(c) << " cuts " << cut1 << " " << cut2;
      }
    }
  }
}

// Error feedback by hand: e = r + g, c = C(e), r = e - D(c), two steps of each compressor.
struct Step {
  std::vector<float> gradient, sent, residual;
};

void ExpectSteps(const Compression& c, const std::vector<Step>& steps) {
  PushCompressor compressor(c, /*error_feedback=*/true, {4});
  for (size_t i = 0; i < steps.size(); ++i) {
    absl::StatusOr<std::shared_ptr<const CompressedTensor>> sent =
        compressor.Compress(0, steps[i].gradient);
    ASSERT_TRUE(sent.ok()) << sent.status();
    absl::StatusOr<std::vector<float>> decoded = Decode(**sent, 4);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, steps[i].sent) << CompressionName(c) << " step " << i + 1;
    const std::vector<float> residual = compressor.Residual(0);
    for (int j = 0; j < 4; ++j) {
      EXPECT_FLOAT_EQ(residual[j], steps[i].residual[j]) << CompressionName(c) << " step " << i + 1;
    }
  }
}

TEST(PushCompressorTest, OneBitResidualByHand) {
  // scale = mean |e| = 6.5 / 4 = 1.625; then e = r + g = [-0.125, -0.875, -2.125, -0.625],
  // scale 3.75 / 4 = 0.9375, every sign negative.
  ExpectSteps(kOneBit, {{{1, -3, 0.5f, 2}, {1.625f, -1.625f, 1.625f, 1.625f},
                         {-0.625f, -1.375f, -1.125f, 0.375f}},
                        {{0.5f, 0.5f, -1, -1}, {-0.9375f, -0.9375f, -0.9375f, -0.9375f},
                         {0.8125f, 0.0625f, -1.1875f, 0.3125f}}});
}

TEST(PushCompressorTest, TopKResidualByHand) {
  // k = 0.5 * 4 = 2: the two largest |e|; then e = [1.5, 0.5, -0.5, -1].
  ExpectSteps(Compression{Compressor::kTopK, 0.5},
              {{{1, -3, 0.5f, 2}, {0, -3, 0, 2}, {1, 0, 0.5f, 0}},
               {{0.5f, 0.5f, -1, -1}, {1.5f, 0, 0, -1}, {0, 0.5f, -0.5f, 0}}});
}

TEST(PushCompressorTest, Int8ResidualByHand) {
  // scale = 127 / 127 = 1, q = round(e) (0.5: ties to even, 0); then e = [-127, 0.25, 1, 0.75].
  ExpectSteps(kInt8, {{{127, -63.375f, 0.5f, 10.25f}, {127, -63, 0, 10}, {0, -0.375f, 0.5f, 0.25f}},
                      {{-127, 0.625f, 0.5f, 0.5f}, {-127, 0, 1, 1}, {0, 0.25f, 0, -0.25f}}});
}

TEST(PushCompressorTest, WithoutErrorFeedbackEachPushStandsAlone) {
  PushCompressor compressor(kOneBit, /*error_feedback=*/false, {4, 2});
  ASSERT_TRUE(compressor.Compress(0, std::vector<float>{1, -3, 0.5f, 2}).ok());
  absl::StatusOr<std::shared_ptr<const CompressedTensor>> second =
      compressor.Compress(0, std::vector<float>{0.5f, 0.5f, -1, -1});
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*Decode(**second, 4), (std::vector<float>{0.75f, 0.75f, -0.75f, -0.75f}));
  EXPECT_EQ(compressor.Residual(0), std::vector<float>(4, 0.0f));
  EXPECT_EQ(compressor.Residual(1), std::vector<float>(2, 0.0f)) << "shard 1 never pushed";
}

}  // namespace
}  // namespace ps
