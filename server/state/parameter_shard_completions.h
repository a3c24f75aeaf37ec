// ParameterShard::Completions, which parameter_shard.cc and parameter_shard_state.cc share (no
// one else includes this).
#pragma once

#include <utility>
#include <vector>

#include "server/state/parameter_shard.h"

namespace ps {

// Pull answers gathered under the lock and delivered once it is released: declare one before the
// MutexLock, so that it is destroyed after it. An admitted pull's values are copied here, under
// the values' own lock, and so is DC-ASGD's copy of an answered whole-shard pull.
class ParameterShard::Completions {
 public:
  explicit Completions(ParameterShard* shard) : shard_(shard) {}
  Completions(const Completions&) = delete;
  Completions& operator=(const Completions&) = delete;
  ~Completions() {
    for (Answer& a : answers_) {
      if (a.status.ok()) {
        Snapshot snapshot =
            shard_->values_.Copy(a.offset, a.length, a.copy_out, a.keep_copy, a.filling);
        if (a.keep_copy) shard_->KeepPulledCopy(a.worker_id, snapshot);
        a.done(std::move(snapshot));
      } else {
        a.done(a.status);
      }
    }
  }
  void Fail(ReadDone done, absl::Status status) {
    answers_.push_back({std::move(done), std::move(status)});
  }
  // An admitted pull of [offset, offset + length).
  void Read(ReadDone done, const ReadRequest& r, bool keep_copy) {
    answers_.push_back({std::move(done), absl::OkStatus(), r.offset, r.length, r.worker_id,
                        keep_copy, r.copy_out, r.filling});
  }

 private:
  struct Answer {
    ReadDone done;
    absl::Status status;
    int64_t offset = 0, length = 0;
    int worker_id = -1;
    bool keep_copy = false;
    ShardValues::CopyOut copy_out = nullptr;
    ShardValues::Filling filling = nullptr;
  };
  ParameterShard* shard_;
  std::vector<Answer> answers_;
};

}  // namespace ps
