#include "client/tensor_path.h"

namespace ps {

std::optional<AttemptEnd> AwaitFinal(const FillProgress* filling,
                                     const grpc::ClientContext& context) {
  if (filling == nullptr ||
      filling->WaitFor(filling->total(), absl::FromChrono(context.deadline())) >=
          filling->total()) {
    return std::nullopt;
  }
  if (filling->stopped()) return AttemptEnd::DroppedHere();
  return AttemptEnd::Answered(absl::DeadlineExceededError(
      "this shard's part of the gradient was not final by the call's deadline"));
}

}  // namespace ps
