#include "client/shared_memory_path.h"

#include <algorithm>
#include <cstring>

#include "client/grpc_path.h"
#include "transport/chunking.h"
#include "transport/grpc_status.h"

namespace ps {
namespace {

// How long a call waits for a region of shared memory that a call this client abandoned still
// uses at the shard (it is copying: milliseconds); past it, the shard is taken to be stuck.
absl::Time ClaimDeadline(const grpc::ClientContext& context) {
  return std::min(absl::FromChrono(context.deadline()), absl::Now() + absl::Seconds(1));
}

}  // namespace

AttemptEnd SharedMemoryPath::Push(const PushPart& part, const PathCall& call, PushDone* done) {
  SharedRegion region = segment_.push();
  // A compressed payload may not fit the region.
  if (part.compressed != nullptr &&
      static_cast<int64_t>(part.compressed->bytes.size()) > region.capacity()) {
    return AttemptEnd::NotTaken();
  }
  std::unique_lock<std::mutex> turn(push_mu_, std::try_to_lock);
  if (!turn.owns_lock()) return AttemptEnd::NotTaken();
  if (std::optional<AttemptEnd> end = AwaitFinal(part.filling, *call.context)) return *end;
  const uint64_t ticket = next_ticket_++;
  if (!region.Claim(SharedRegion::kBusy, ticket, ClaimDeadline(*call.context))) {
    return AttemptEnd::PathLost(absl::FailedPreconditionError("its push region stayed busy"));
  }
  if (part.compressed != nullptr) {
    std::memcpy(region.data(), part.compressed->bytes.data(), part.compressed->bytes.size());
  } else {
    done->saturated = EncodeValues(part.values, part.type, region.data());
  }
  region.Move(SharedRegion::kBusy, SharedRegion::kReady, ticket);
  v1::PushHeader header = part.header;
  header.mutable_path()->set_shm_segment(id_);
  header.mutable_path()->set_shm_ticket(ticket);
  return AttemptEnd::FromShard(call.rpc->PushHeader(header, call.context, &done->response));
}

AttemptEnd SharedMemoryPath::Pull(PullPart& part, const PathCall& call, v1::PullChunk* answer) {
  std::unique_lock<std::mutex> turn(pull_mu_, std::try_to_lock);
  if (!turn.owns_lock()) return AttemptEnd::NotTaken();
  const uint64_t ticket = next_ticket_++;
  SharedRegion region = segment_.pull();
  if (!region.Claim(SharedRegion::kReady, ticket, ClaimDeadline(*call.context))) {
    return AttemptEnd::PathLost(absl::FailedPreconditionError("its pull region stayed busy"));
  }
  v1::PullRequest request = part.request;
  request.mutable_path()->set_shm_segment(id_);
  request.mutable_path()->set_shm_ticket(ticket);
  AttemptEnd end = AttemptEnd::FromShard(call.rpc->PullHead(request, call.context, answer));
  if (!end.ok()) return end;
  const int64_t n = static_cast<int64_t>(part.values.size());
  if (answer->dtype() != request.dtype() || answer->offset() != request.offset() ||
      answer->shm_values() != n) {
    return AttemptEnd::Answered(
        absl::DataLossError("a pull through shared memory is one chunk naming the values"));
  }
  if (!region.Move(SharedRegion::kFilled, SharedRegion::kBusy, ticket)) {
    return AttemptEnd::PathLost(
        absl::FailedPreconditionError("its pull region did not hold the values"));
  }
  ChunkAssembler assembler(part.values, part.type);
  absl::Status copied =
      assembler.Append(std::string_view(region.data(), n * assembler.element_bytes()));
  region.Move(SharedRegion::kBusy, SharedRegion::kIdle, ticket);
  if (copied.ok()) copied = assembler.Finish();
  return AttemptEnd::Answered(copied);
}

}  // namespace ps
