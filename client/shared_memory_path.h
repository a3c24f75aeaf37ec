// Tensors through a segment of shared memory with a shard process on this host
// (transport/shared_memory.h), negotiated at registration (AttachSharedMemory): a push's values
// go into the segment's push region before its gRPC call (which names them) starts; a pull's come
// into its pull region before the call's answer. One region each way: a part that finds its
// region in use by another call of this client is not taken (it goes by the next path). A region
// that stays busy, or that the shard says it cannot use, loses the path. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

#include "client/tensor_path.h"
#include "transport/shared_memory.h"

namespace ps {

class SharedMemoryPath : public TensorPath {
 public:
  // The segment the shard named `id`.
  SharedMemoryPath(int64_t id, SharedSegment segment) : id_(id), segment_(std::move(segment)) {}

  absl::string_view name() const override { return "shared memory"; }
  AttemptEnd Push(const PushPart& part, const PathCall& call, PushDone* done) override;
  AttemptEnd Pull(PullPart& part, const PathCall& call, v1::PullChunk* answer) override;

 private:
  const int64_t id_;
  const SharedSegment segment_;
  std::mutex push_mu_, pull_mu_;  // a region's turn: held by the call using it
  std::atomic<uint64_t> next_ticket_{1};
};

}  // namespace ps
