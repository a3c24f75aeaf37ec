// Where a call's tensor travels, chosen once per call. A Push or Initialize reads its payload from
// a PayloadSource: the rest of its gRPC client stream (StreamPayload: chunks of raw bytes, decoded
// straight from gRPC's slices), the push region of the client's shared-memory segment
// (SharedPayload, transport/shared_memory.h), or the data-plane call the push itself is
// (PlaneCallPayload, transport/data_plane.h). A Pull's values go out as gRPC chunks (the
// service's PullWriter), into the segment's pull region (WriteSharedPull) or on the data plane
// (DataPlane::Send).
//
// Each source serves one call and is not thread-safe; WriteSharedPull is.
#pragma once

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/sync_stream.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/wire_type.h"
#include "server/rpc/call_limits.h"
#include "transport/chunking.h"
#include "transport/data_plane.h"
#include "transport/shared_memory.h"
#include "transport/shared_segments.h"
#include "transport/tensor_codec.h"

namespace ps {

class PayloadSource {
 public:
  virtual ~PayloadSource() = default;
  // Decodes the payload, dst.size() values in `format`, into `dst`, telling `seen` of each run of
  // values as soon as it is in, in order, each value once, or of none (a compressed payload's,
  // shared memory's). INVALID_ARGUMENT (naming the problem) when it is not exactly that many
  // values or is malformed; `dst` may then hold part of it. Call once.
  virtual absl::Status ReadInto(absl::Span<float> dst, const PayloadFormat& format,
                                ValuesSeen seen) = 0;
};

// The first message of a chunked tensor stream (Initialize, Push), split: its fields but the data
// parsed as `Chunk`, and the data still in gRPC's slices. INVALID_ARGUMENT naming `method` for an
// empty stream, bytes that do not parse, or no header.
template <typename Chunk>
absl::Status ReadFirstChunk(grpc::ServerReader<grpc::ByteBuffer>* reader, const char* method,
                            Chunk* chunk, std::optional<TensorMessage>* data) {
  grpc::ByteBuffer bytes;
  if (!reader->Read(&bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("empty ", method, " stream"));
  }
  absl::StatusOr<TensorMessage> m = TensorMessage::Decode(bytes, Chunk::kDataFieldNumber);
  if (!m.ok() || !chunk->ParseFromString(m->head())) {
    return absl::InvalidArgumentError(absl::StrCat("cannot parse ", method, " chunk"));
  }
  if (!chunk->has_header()) {
    return absl::InvalidArgumentError(absl::StrCat("the first ", method, " chunk has no header"));
  }
  data->emplace(*std::move(m));
  return absl::OkStatus();
}

// The payload of a chunked stream of `Chunk` messages whose first message (read by ReadFirstChunk)
// carried `first`: that data, then every later chunk's. Only the first chunk may carry a header,
// and every later one must carry data, so a stream has at most dst.size() + 1 chunks. Each
// message read counts as progress for the call's watchdog `guard`.
template <typename Chunk>
class StreamPayload final : public PayloadSource {
 public:
  // `reader` and `guard` must outlive this.
  StreamPayload(grpc::ServerReader<grpc::ByteBuffer>* reader, TensorMessage first,
                StreamWatchdog::Guard* guard)
      : reader_(reader), first_(std::move(first)), guard_(guard) {}

  absl::Status ReadInto(absl::Span<float> dst, const PayloadFormat& format,
                        ValuesSeen seen) override {
    ChunkAssembler assembler(dst, format);
    std::optional<TensorMessage> m(std::move(first_));
    grpc::ByteBuffer bytes;
    for (bool is_first = true;; is_first = false) {
      guard_->Progress();
      if (!is_first) {
        Chunk chunk;
        if (!chunk.ParseFromString(m->head())) {
          return absl::InvalidArgumentError("cannot parse a chunk");
        }
        if (chunk.has_header()) {
          return absl::InvalidArgumentError("a header appeared after the first chunk");
        }
        if (m->tensor_bytes() == 0) {
          return absl::InvalidArgumentError("an empty chunk after the first");
        }
      }
      const int64_t before = assembler.received();
      if (absl::Status s = m->AppendTensorTo(&assembler); !s.ok()) return s;
      if (format.compressor == Compressor::kNone) {
        seen(absl::Span<const float>(dst).subspan(before, assembler.received() - before));
      }
      if (!reader_->Read(&bytes)) break;
      absl::StatusOr<TensorMessage> next = TensorMessage::Decode(bytes, Chunk::kDataFieldNumber);
      if (!next.ok()) return next.status();
      m.emplace(*std::move(next));
    }
    return assembler.Finish();
  }

 private:
  grpc::ServerReader<grpc::ByteBuffer>* const reader_;
  TensorMessage first_;
  StreamWatchdog::Guard* const guard_;
};

// The push region of a client's shared-memory segment, taken for one request (moved from ready
// to busy) until this is destroyed, when it is given back (idle) for the client to reuse. The
// values are copied out of the region before anything checks them, so the client cannot change
// what was checked.
class SharedPayload final : public PayloadSource {
 public:
  // Takes the push region of segment `segment` of `segments` for a push of worker `worker_id`
  // handed over as `ticket`; the stream, whose first message carried `first`, must carry no data
  // (INVALID_ARGUMENT). NOT_FOUND or FAILED_PRECONDITION when the segment or the region's turn is
  // not what the request says (the client then sends the push over gRPC).
  static absl::StatusOr<std::unique_ptr<SharedPayload>> Take(
      SharedSegments& segments, grpc::ServerReader<grpc::ByteBuffer>* reader,
      const TensorMessage& first, int64_t segment, uint64_t ticket, int worker_id);
  ~SharedPayload() override;

  // INVALID_ARGUMENT also if the payload is larger than the region (a compressed payload may be).
  // Tells `seen` of nothing: the values are copied out in one piece (payload.cc says why).
  absl::Status ReadInto(absl::Span<float> dst, const PayloadFormat& format,
                        ValuesSeen seen) override;

 private:
  SharedPayload(std::shared_ptr<const SharedSegment> segment, uint64_t ticket)
      : segment_(std::move(segment)), ticket_(ticket) {}
  const std::shared_ptr<const SharedSegment> segment_;
  const uint64_t ticket_;
};

// The tensor of a push made on the data plane itself (DataPlane's PushCall): the frame after the
// call's (and the other lanes' parts of a striped one), read straight into the call's buffer,
// each run told of as it comes in.
class PlaneCallPayload final : public PayloadSource {
 public:
  using ReadValues =
      absl::FunctionRef<absl::Status(absl::Span<float>, WireType, ValuesSeen, ValuesOrder)>;
  // `read_values` must outlive this; the values come in `order`.
  PlaneCallPayload(ReadValues read_values, ValuesOrder order)
      : read_values_(read_values), order_(order) {}
  // FrameInbox::ReadCallValues's errors; INVALID_ARGUMENT for a compressed payload (those travel
  // over gRPC).
  absl::Status ReadInto(absl::Span<float> dst, const PayloadFormat& format,
                        ValuesSeen seen) override;

 private:
  const ReadValues read_values_;
  const ValuesOrder order_;
};

// Writes `values` as `type` into the pull region of segment `segment` of `segments`, if it waits
// for request `ticket` of worker `worker_id` (ready -> busy -> filled); returns how many values
// were saturated to the type's range. NOT_FOUND or FAILED_PRECONDITION when the segment is gone or
// the region waits for another request (the client then pulls over gRPC); INTERNAL if the values
// are larger than the region.
absl::StatusOr<int64_t> WriteSharedPull(SharedSegments& segments, int64_t segment, int worker_id,
                                        uint64_t ticket, absl::Span<const float> values,
                                        WireType type);

}  // namespace ps
