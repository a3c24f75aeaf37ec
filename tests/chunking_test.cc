#include "transport/chunking.h"

#include <gtest/gtest.h>

#include <grpcpp/support/byte_buffer.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "transport/tensor_codec.h"
#include "proto/ps.pb.h"

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

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Encodes then decodes through the wire type; `saturated` gets EncodeValues' count.
std::vector<float> ThroughWire(const std::vector<float>& v, WireType type,
                               int64_t* saturated = nullptr) {
  std::string bytes;
  int64_t n = EncodeValues(v, type, &bytes);
  if (saturated != nullptr) *saturated = n;
  EXPECT_EQ(bytes.size(), v.size() * WireBytes(type));
  std::vector<float> out(v.size());
  DecodeValues(bytes, type, absl::MakeSpan(out));
  return out;
}

TEST(WireTypeTest, BFloat16RoundsToNearestEvenAndKeepsSpecials) {
  const float one_ulp = std::ldexp(1.0f, -7);  // bfloat16's step just above 1
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> in = {1.0f, 1.0f + one_ulp / 2, 1.0f + one_ulp * 1.5f,
                           1.0f + one_ulp / 2 + std::ldexp(1.0f, -20), -2.5f, 0.0f, inf, -inf,
                           std::numeric_limits<float>::max()};
  int64_t saturated = 0;
  std::vector<float> out = ThroughWire(in, WireType::kBFloat16, &saturated);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 1.0f);                      // a tie goes to the even neighbour
  EXPECT_EQ(out[2], 1.0f + 2 * one_ulp);        // a tie to the even one above
  EXPECT_EQ(out[3], 1.0f + one_ulp);            // past the tie: up
  EXPECT_EQ(out[4], -2.5f);                     // exact
  EXPECT_EQ(Bits(out[5]), 0u);
  EXPECT_EQ(out[6], inf);
  EXPECT_EQ(out[7], -inf);
  EXPECT_TRUE(std::isfinite(out[8]));           // saturated, not infinite
  EXPECT_EQ(saturated, 1);
  EXPECT_TRUE(std::isnan(ThroughWire({std::nanf("")}, WireType::kBFloat16)[0]));
}

TEST(WireTypeTest, Float16RoundsSaturatesAndKeepsSpecials) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> in = {1.0f, 1.0f + std::ldexp(1.0f, -11), 65504.0f, 70000.0f, -1e9f,
                           std::ldexp(1.0f, -24), 1e-9f, inf, -3.140625f};
  int64_t saturated = 0;
  std::vector<float> out = ThroughWire(in, WireType::kFloat16, &saturated);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 1.0f);  // a tie at half float16's step goes to the even neighbour
  EXPECT_EQ(out[2], 65504.0f);
  EXPECT_EQ(out[3], 65504.0f);
  EXPECT_EQ(out[4], -65504.0f);
  EXPECT_EQ(saturated, 2);
  EXPECT_EQ(out[5], std::ldexp(1.0f, -24));  // the smallest subnormal survives
  EXPECT_EQ(out[6], 0.0f);                   // below it: zero
  EXPECT_EQ(out[7], inf);
  EXPECT_EQ(out[8], -3.140625f);             // exact
  EXPECT_TRUE(std::isnan(ThroughWire({std::nanf("")}, WireType::kFloat16)[0]));
  // Long spans (the vectorised path and its tail) agree with element-by-element conversion.
  std::vector<float> many(1037);
  for (size_t i = 0; i < many.size(); ++i) many[i] = std::sin(0.37f * i) * 100.0f;
  std::vector<float> whole = ThroughWire(many, WireType::kFloat16);
  for (size_t i = 0; i < many.size(); ++i) {
    ASSERT_EQ(whole[i], ThroughWire({many[i]}, WireType::kFloat16)[0]) << i;
    ASSERT_NEAR(whole[i], many[i], std::fabs(many[i]) / 1024) << i;
  }
}

// Bytes straight from gRPC's slices may start at any address.
TEST(WireTypeTest, DecodesFromUnalignedBytes) {
  std::vector<float> in(37);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) - 18.5f;  // exact in both
  for (WireType type : {WireType::kBFloat16, WireType::kFloat16, WireType::kFloat32}) {
    std::string bytes;
    EncodeValues(in, type, &bytes);
    std::string shifted = "x" + bytes;
    std::vector<float> out(in.size());
    DecodeValues(std::string_view(shifted).substr(1), type, absl::MakeSpan(out));
    EXPECT_EQ(out, in) << WireTypeName(type);
  }
}

TEST(WireTypeTest, ParsesNamesAndDTypeNumbers) {
  EXPECT_EQ(*ParseWireType("bf16"), WireType::kBFloat16);
  EXPECT_EQ(*ParseWireType("fp16"), WireType::kFloat16);
  EXPECT_EQ(*ParseWireType("fp32"), WireType::kFloat32);
  EXPECT_FALSE(ParseWireType("int8").ok());
  EXPECT_EQ(*WireTypeOfDType(2), WireType::kBFloat16);
  EXPECT_FALSE(WireTypeOfDType(0).ok());
  EXPECT_FALSE(WireTypeOfDType(4).ok());
}

TEST(ChunkAssemblerTest, Decodes16BitChunksAcrossTheChunkSizeAndRefusesHalfValues) {
  std::vector<float> in(kChunkBytes / 2 + 5);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 64) * 0.25f;  // exact in bfloat16
  std::vector<float> out(in.size());
  ChunkAssembler a(absl::MakeSpan(out), WireType::kBFloat16);
  int pieces = 0;
  ForEachChunk(in, kChunkBytes / 2, [&](int64_t, std::string_view raw) {
    ++pieces;
    std::string bytes;
    EXPECT_EQ(EncodeValues(absl::MakeSpan(reinterpret_cast<const float*>(raw.data()),
                                          raw.size() / sizeof(float)),
                           WireType::kBFloat16, &bytes),
              0);
    EXPECT_LE(static_cast<int64_t>(bytes.size()), kChunkBytes);
    ASSERT_TRUE(a.Append(bytes).ok());
  });
  EXPECT_EQ(pieces, 2);
  ASSERT_TRUE(a.Finish().ok());
  EXPECT_EQ(out, in);
  ChunkAssembler odd(absl::MakeSpan(out), WireType::kFloat16);
  absl::Status s = odd.Append(std::string(3, 'x'));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("whole number of fp16 values"), std::string::npos) << s;
}

// A tensor referenced by the message parses as if it had been copied into it, and its owner is
// released once gRPC (here: the ByteBuffer) lets go of the bytes.
TEST(TensorCodecTest, AReferencedTensorParsesAsTheMessagesDataAndItsOwnerIsReleased) {
  auto values = std::make_shared<std::vector<float>>(300000);
  std::iota(values->begin(), values->end(), 0.5f);
  v1::PullChunk head;
  head.set_version(7);
  head.set_offset(123456789012);
  head.set_dtype(v1::BFLOAT16);
  std::weak_ptr<std::vector<float>> watch = values;
  {
    grpc::ByteBuffer buffer = EncodeWithTensor(
        head.SerializeAsString(), v1::PullChunk::kDataFieldNumber, AsBytes(*values), values);
    values.reset();
    EXPECT_FALSE(watch.expired());  // the slice still holds it
    grpc::Slice flat;
    ASSERT_TRUE(buffer.DumpToSingleSlice(&flat).ok());
    v1::PullChunk parsed;
    ASSERT_TRUE(parsed.ParseFromArray(flat.begin(), static_cast<int>(flat.size())));
    EXPECT_EQ(parsed.version(), 7);
    EXPECT_EQ(parsed.offset(), 123456789012);
    EXPECT_EQ(parsed.dtype(), v1::BFLOAT16);
    ASSERT_EQ(parsed.data().size(), 300000 * sizeof(float));
    std::vector<float> back(300000);
    std::memcpy(back.data(), parsed.data().data(), parsed.data().size());
    EXPECT_EQ(back, *watch.lock());
  }
  EXPECT_TRUE(watch.expired());
  grpc::ByteBuffer empty = EncodeWithTensor("", 3, std::string_view(), nullptr);
  grpc::Slice flat;
  ASSERT_TRUE(empty.DumpToSingleSlice(&flat).ok());
  v1::PullChunk parsed;
  ASSERT_TRUE(parsed.ParseFromArray(flat.begin(), static_cast<int>(flat.size())));
  EXPECT_TRUE(parsed.data().empty());
}

// A message split into slices at awkward places (inside varints, inside a value of the tensor)
// decodes to the same head and tensor; malformed bytes are refused.
TEST(TensorCodecTest, DecodingSplitsAroundTheTensorAcrossAnySlicesAndRefusesMalformedBytes) {
  std::vector<float> values = {1.5f, -2.25f, 3e-3f, 4e4f, -0.0f, 6.0f, 7.0f};
  v1::PushChunk message;
  message.mutable_header()->set_worker_id(3);
  message.mutable_header()->set_sequence(1234567);
  message.set_data(std::string(AsBytes(values)));
  const std::string wire = message.SerializeAsString();
  for (size_t cut1 = 1; cut1 < wire.size(); cut1 += 3) {
    for (size_t cut2 = cut1 + 1; cut2 < wire.size(); cut2 += 5) {
      grpc::Slice slices[3] = {grpc::Slice(wire.data(), cut1),
                               grpc::Slice(wire.data() + cut1, cut2 - cut1),
                               grpc::Slice(wire.data() + cut2, wire.size() - cut2)};
      absl::StatusOr<TensorMessage> m =
          TensorMessage::Decode(grpc::ByteBuffer(slices, 3), v1::PushChunk::kDataFieldNumber);
      ASSERT_TRUE(m.ok()) << m.status();
      v1::PushChunk head;
      ASSERT_TRUE(head.ParseFromString(m->head()));
      EXPECT_EQ(head.header().sequence(), 1234567);
      EXPECT_TRUE(head.data().empty());
      std::vector<float> out(values.size());
      ChunkAssembler assembler(absl::MakeSpan(out));
      ASSERT_TRUE(m->AppendTensorTo(&assembler).ok()) << cut1 << " " << cut2;
      ASSERT_TRUE(assembler.Finish().ok());
      ASSERT_EQ(std::memcmp(out.data(), values.data(), sizeof(float) * values.size()), 0);
    }
  }
  auto decode = [](const std::string& bytes) {
    grpc::Slice slice(bytes);
    return TensorMessage::Decode(grpc::ByteBuffer(&slice, 1), v1::PushChunk::kDataFieldNumber)
        .status();
  };
  EXPECT_EQ(decode(wire.substr(0, wire.size() - 1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(decode(std::string("\x12\x80", 2)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(decode(std::string("\x10\x01", 2)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(decode(std::string("\x12\x00\x12\x00", 4)).code(),
            absl::StatusCode::kInvalidArgument);  // the tensor twice
  EXPECT_EQ(decode(std::string("\x0b\x0c", 2)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(decode(std::string("\x00", 1)).code(), absl::StatusCode::kInvalidArgument);
  // A tensor whose length is not a whole number of values reaches the assembler, which refuses it.
  grpc::Slice odd(std::string("\x12\x05" "abcde", 7));
  absl::StatusOr<TensorMessage> m =
      TensorMessage::Decode(grpc::ByteBuffer(&odd, 1), v1::PushChunk::kDataFieldNumber);
  ASSERT_TRUE(m.ok());
  std::vector<float> out(2);
  ChunkAssembler assembler(absl::MakeSpan(out));
  EXPECT_EQ(m->AppendTensorTo(&assembler).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
