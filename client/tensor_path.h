// One way of moving one shard's part of a push or a pull between this client and the shard: the
// gRPC stream (client/grpc_path.h), shared memory with a shard on this host
// (client/shared_memory_path.h) or the shard's data plane (client/data_plane_path.h). A client's
// session with a shard holds its paths in fallback order (shared memory, the data plane, gRPC) and
// gives each part to the first that takes it; compression is a decorator around any of them
// (client/compressed_path.h). A new kind of call is one more method here, not one more branch in
// every caller.
//
// A path does one attempt; the caller retries (client/retry_policy.h). What an attempt ended in
// is typed (AttemptEnd: kNotTaken, the next path then; kPathLost, the path dropped), never told
// by status strings.
#pragma once

#include <grpcpp/client_context.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "client/retry_policy.h"
#include "common/compression.h"
#include "common/fill_progress.h"
#include "common/wire_type.h"
#include "proto/ps.pb.h"
#include "transport/data_frames.h"

namespace ps {

class GrpcPath;

// One shard's part of a push: its header (identity, sequence, base version, range and dtype, as
// the session wrote them; a path adds its own fields) and its values, or those values compressed.
struct PushPart {
  v1::PushHeader header;
  absl::Span<const float> values;  // the part's gradient, encoded as `type` on the way
  WireType type = WireType::kFloat32;
  // Sent instead of `values` when not null (header.dtype names its compressor).
  std::shared_ptr<const CompressedTensor> compressed;
  // The push's own place for this part's compressed bytes, made at its first attempt and resent
  // by its retries (client/compressed_path.h); null where the client does not compress.
  std::shared_ptr<const CompressedTensor>* compressed_once = nullptr;
  // A held push's part whose values are still being filled in from the end (a backward pass),
  // or null: they are final. A path that cannot send them as they come waits for them first
  // (TensorPath::Push's `await_final`).
  FillProgress* filling = nullptr;
};

// What the shard answered to a push part.
struct PushDone {
  v1::PushResponse response;
  int64_t saturated = 0;  // values beyond the wire type's range, sent as its largest
};

// One shard's part of a pull: the request (range, dtype, identity, as the session wrote it) and
// where its values go.
struct PullPart {
  v1::PullRequest request;
  absl::Span<float> values;  // the shard's range of the caller's buffer
  WireType type = WireType::kFloat32;
  // Told of each run of values as it is in place, where they come as a stream (a forward pass
  // may start on the first layers' weights).
  ValuesSeen seen = IgnoreValues;
};

// What every attempt on a path has: the gRPC call's context (deadline, token, cancellation) and
// the gRPC path to the replica called now, which paths that name their tensor in a gRPC call
// use.
struct PathCall {
  grpc::ClientContext* context;
  GrpcPath* rpc;
};

// Thread-safe: several calls may use one path at once (a path that cannot serve two answers
// kNotTaken to the second).
class TensorPath {
 public:
  virtual ~TensorPath() = default;
  virtual absl::string_view name() const = 0;
  // One attempt at pushing `part`; `done` holds the shard's answer when it is OK.
  virtual AttemptEnd Push(const PushPart& part, const PathCall& call, PushDone* done) = 0;
  // One attempt at pulling `part` into its values; `answer` holds the shard's first chunk (its
  // version, dtype, range) when OK.
  virtual AttemptEnd Pull(PullPart& part, const PathCall& call, v1::PullChunk* answer) = 0;
  // Whether a push part of `values` float32 values may start while they are still being filled
  // in (sent as they come, the last piece first); false: Push waits for them first.
  virtual bool SendsAsFilled(int64_t values) const { return false; }
};

// Waits until a part's values are final (`filling`, PushPart::filling; null: they are), at most
// until the call's deadline: nullopt once they are, else how the attempt ends
// (DEADLINE_EXCEEDED, or kDroppedHere if the push was dropped meanwhile).
std::optional<AttemptEnd> AwaitFinal(const FillProgress* filling,
                                     const grpc::ClientContext& context);

}  // namespace ps
