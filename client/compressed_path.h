// Compression (common/compression.h) as a decorator around any of a shard's paths: a session
// whose client compresses (ClientOptions::compression, ::pull_compression) puts one around each
// path it tries. A push part is compressed once, at its first attempt, its values final by then
// (PushCompressor: the error-feedback residual moves once), into the push's own slot
// (PushPart::compressed_once), so that a retry on any path resends the same bytes; the path
// carries the bytes where it can (gRPC, shared memory when they fit; the data plane carries
// values only and answers kNotTaken). A pull names the view of the shard's range this client
// holds and gets the change since (CompressedPulls), over the gRPC path (the others answer
// kNotTaken).
//
// Thread-safe as the path it wraps; the shard's Compression is shared by its session's wrappers.
#pragma once

#include <memory>

#include "client/compressed_pulls.h"
#include "client/push_compressor.h"
#include "client/tensor_path.h"

namespace ps {

class CompressedPath final : public TensorPath {
 public:
  // A shard's compression: of its pushes' parts (null: they go as values) and its pulls (null:
  // whole values).
  struct Compression {
    std::unique_ptr<PushCompressor> pushes;
    std::unique_ptr<CompressedPulls> pulls;
  };
  // `inner` and `compression` must outlive this.
  CompressedPath(TensorPath& inner, Compression& compression)
      : inner_(inner), compression_(compression) {}

  absl::string_view name() const override { return inner_.name(); }
  // INTERNAL for a part with no compressed_once slot.
  AttemptEnd Push(const PushPart& part, const PathCall& call, PushDone* done) override;
  AttemptEnd Pull(PullPart& part, const PathCall& call, v1::PullChunk* answer) override;
  // Never for a compressed push: its bytes are made once the values are final.
  bool SendsAsFilled(int64_t values) const override;

 private:
  TensorPath& inner_;
  Compression& compression_;
};

}  // namespace ps
