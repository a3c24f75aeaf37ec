#include "client/compressed_path.h"

#include <optional>

#include "client/grpc_path.h"

namespace ps {

AttemptEnd CompressedPath::Push(const PushPart& part, const PathCall& call, PushDone* done) {
  if (compression_.pushes == nullptr) return inner_.Push(part, call, done);
  if (part.compressed_once == nullptr) {
    return AttemptEnd::Answered(absl::InternalError("a compressed push part has no slot"));
  }
  std::shared_ptr<const CompressedTensor>& bytes = *part.compressed_once;
  if (bytes == nullptr) {
    if (std::optional<AttemptEnd> end = AwaitFinal(part.filling, *call.context)) return *end;
    absl::StatusOr<std::shared_ptr<const CompressedTensor>> made =
        compression_.pushes->Compress(0, part.values);
    if (!made.ok()) return AttemptEnd::Answered(made.status());
    bytes = *std::move(made);
  }
  PushPart compressed = part;
  compressed.compressed = bytes;
  compressed.filling = nullptr;  // final: compressed from them
  compressed.header.set_dtype(static_cast<v1::DType>(bytes->compressor));
  compressed.header.set_topk_pairs(bytes->pairs);
  return inner_.Push(compressed, call, done);
}

AttemptEnd CompressedPath::Pull(PullPart& part, const PathCall& call, v1::PullChunk* answer) {
  if (compression_.pulls == nullptr) return inner_.Pull(part, call, answer);
  if (&inner_ != call.rpc) return AttemptEnd::NotTaken();  // a change travels over gRPC
  return compression_.pulls->Pull(part, *call.rpc, call.context, answer);
}

bool CompressedPath::SendsAsFilled(int64_t values) const {
  return compression_.pushes == nullptr && inner_.SendsAsFilled(values);
}

}  // namespace ps
