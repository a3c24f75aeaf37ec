#include "client/compressed_pulls.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "transport/chunking.h"

namespace ps {

AttemptEnd CompressedPulls::Pull(PullPart& part, GrpcPath& rpc, grpc::ClientContext* context,
                                 v1::PullChunk* answer) {
  const int64_t n = static_cast<int64_t>(part.values.size());
  const int64_t begin = part.request.offset();
  View& view = view_;
  absl::MutexLock view_lock(&view.mu);
  // Whatever this attempt ends in, the view it names is used up: the shard moves on from it.
  const uint64_t held = std::exchange(view.id, 0);
  v1::PullRequest request = part.request;
  request.set_compress(static_cast<v1::DType>(compression_.compressor));
  request.set_topk_fraction(compression_.topk_fraction);
  request.set_view(held);
  view.values.resize(n);
  auto reader = rpc.stub()->Pull(context, request);
  std::optional<ChunkAssembler> assembler;
  v1::PullChunk& first = *answer;
  v1::PullChunk chunk;
  absl::Status bad;
  for (bool is_first = true; reader->Read(&chunk); is_first = false) {
    if (is_first) {
      // What heads the answer, not its values (a copy of those costs page faults).
      first.set_version(chunk.version());
      first.set_offset(chunk.offset());
      first.set_view(chunk.view());
      first.set_base_view(chunk.base_view());
      first.set_topk_pairs(chunk.topk_pairs());
      first.set_dtype(chunk.dtype());
      if (chunk.base_view() == 0) {  // the whole values
        if (chunk.dtype() != request.dtype()) {
          bad = absl::DataLossError(absl::StrCat("asked for dtype ", request.dtype(), ", got ",
                                                 chunk.dtype(), " (an older shard?)"));
        } else {
          assembler.emplace(absl::MakeSpan(view.values), part.type);
        }
      } else if (chunk.base_view() != held || chunk.dtype() != request.compress()) {
        bad = absl::DataLossError("a compressed pull's change is not to the view it named");
      } else {
        absl::StatusOr<PayloadFormat> format =
            PushPayloadFormat(chunk.dtype(), chunk.topk_pairs(), n);
        bad = format.status();
        view.change.resize(n);
        if (bad.ok()) assembler.emplace(absl::MakeSpan(view.change), *format);
      }
    }
    if (!bad.ok()) continue;  // drain the stream so Finish() returns
    if (chunk.view() != first.view() || chunk.base_view() != first.base_view() ||
        chunk.topk_pairs() != first.topk_pairs() || chunk.dtype() != first.dtype() ||
        (first.base_view() == 0 && chunk.offset() != begin + assembler->received())) {
      bad = absl::DataLossError("a compressed pull's chunks disagree");
    } else {
      bad = assembler->Append(chunk.data());
    }
  }
  AttemptEnd end = AttemptEnd::FromShard(reader->Finish());
  if (!end.ok()) return end;
  if (bad.ok()) {
    bad = assembler.has_value() ? assembler->Finish() : absl::DataLossError("an empty answer");
  }
  if (!bad.ok()) return AttemptEnd::Answered(bad);
  if (first.base_view() != 0) {  // as the shard adds it to its copy of the view, bit for bit
    for (int64_t i = 0; i < n; ++i) view.values[i] += view.change[i];
  }
  std::copy(view.values.begin(), view.values.end(), part.values.begin());
  view.id = first.view();
  return end;
}

}  // namespace ps
