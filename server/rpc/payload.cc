#include "server/rpc/payload.h"

#include <string_view>

#include "server/state/optimizer.h"
#include "transport/data_frames.h"

namespace ps {

// A striped push's parts start where the shard's scan blocks do: each part's runs go to blocks of
// their own, so that any order of the parts sums up the same (GradientScan).
static_assert(kStripeAlign % GradientScan::kBlock == 0);

absl::StatusOr<std::unique_ptr<SharedPayload>> SharedPayload::Take(
    SharedSegments& segments, grpc::ServerReader<grpc::ByteBuffer>* reader,
    const TensorMessage& first, int64_t segment, uint64_t ticket, int worker_id) {
  grpc::ByteBuffer more;
  if (first.tensor_bytes() != 0 || reader->Read(&more)) {
    return absl::InvalidArgumentError("a push through shared memory carries no data in its stream");
  }
  absl::StatusOr<std::shared_ptr<const SharedSegment>> found = segments.Find(segment, worker_id);
  if (!found.ok()) return found.status();
  if (!(*found)->push().Move(SharedRegion::kReady, SharedRegion::kBusy, ticket)) {
    return absl::FailedPreconditionError(
        "the shared push region does not hold this request's gradient (another took its turn)");
  }
  return std::unique_ptr<SharedPayload>(new SharedPayload(*std::move(found), ticket));
}

SharedPayload::~SharedPayload() {
  segment_->push().Move(SharedRegion::kBusy, SharedRegion::kIdle, ticket_);
}

absl::Status SharedPayload::ReadInto(absl::Span<float> dst, const PayloadFormat& format,
                                     ValuesSeen) {
  SharedRegion region = segment_->push();
  const int64_t bytes = PayloadBytes(format, static_cast<int64_t>(dst.size()));
  if (bytes > region.capacity()) {
    return absl::InvalidArgumentError(absl::StrCat("a push of ", bytes,
                                                   " bytes is larger than its shared region (",
                                                   region.capacity(), " bytes)"));
  }
  // One copy, told of nothing: copied in cache-sized runs (to scan each while in the cache) a
  // large push went 25% slower (bench/RESULTS.md "Scanning a push as it arrives"): one large
  // copy streams past the cache, and the shard then scans the buffer itself.
  ChunkAssembler assembler(dst, format);
  absl::Status s = assembler.Append(std::string_view(region.data(), bytes));
  if (s.ok()) s = assembler.Finish();
  return s;
}

absl::Status PlaneCallPayload::ReadInto(absl::Span<float> dst, const PayloadFormat& format,
                                        ValuesSeen seen) {
  if (format.compressor != Compressor::kNone) {
    return absl::InvalidArgumentError("a compressed push travels over gRPC, not the data plane");
  }
  return read_values_(dst, format.type, seen, order_);
}

absl::StatusOr<int64_t> WriteSharedPull(SharedSegments& segments, int64_t segment, int worker_id,
                                        uint64_t ticket, absl::Span<const float> values,
                                        WireType type) {
  absl::StatusOr<std::shared_ptr<const SharedSegment>> found = segments.Find(segment, worker_id);
  if (!found.ok()) return found.status();
  SharedRegion region = (*found)->pull();
  if (static_cast<int64_t>(values.size()) * WireBytes(type) > region.capacity()) {
    return absl::InternalError("a pull larger than its shared region");
  }
  if (!region.Move(SharedRegion::kReady, SharedRegion::kBusy, ticket)) {
    return absl::FailedPreconditionError(
        "the shared pull region is not waiting for this request (another took its turn)");
  }
  const int64_t saturated = EncodeValues(values, type, region.data());
  region.Move(SharedRegion::kBusy, SharedRegion::kFilled, ticket);
  return saturated;
}

}  // namespace ps
