// Pulls waiting to be admitted (a sync barrier, the SSP bound, a shard not yet initialised), each
// until its deadline, and the thread that wakes when the earliest deadline passes. What admits a
// pull is its owner's business (ParameterShard): after each change of state, the owner offers
// every waiting pull an answer (AnswerEach); when a deadline passes, the queue's thread calls
// `on_deadline` and the owner does the same.
// Thread-safe. Lock order: the owner's lock, then the queue's; `on_deadline` is called with no
// lock of the queue held.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/model_identity.h"
#include "server/state/shard_values.h"

namespace ps {

// A pull: [offset, offset + length) (offset 0 and length 0: the whole shard) for a client of
// `model`, as worker `worker_id` (negative: an observer), made after its push of
// `after_sequence` (-1: none; a prefetch otherwise), answered by `deadline` at the latest.
struct ReadRequest {
  ModelIdentity model;
  int worker_id = -1;
  int64_t offset = 0;
  int64_t length = 0;
  int64_t after_sequence = -1;
  absl::Time deadline;
  // Optional: where the values go instead of a snapshot (ShardValues::CopyOut). The Snapshot
  // given to `done` then holds no values (or a copy the shard kept for itself).
  ShardValues::CopyOut copy_out = nullptr;
  // Optional: the snapshot is announced before it is filled (ShardValues::Filling).
  ShardValues::Filling filling = nullptr;
};
using ReadDone = std::function<void(absl::StatusOr<ShardValues::Snapshot>)>;

class PullQueue {
 public:
  struct Waiter {
    ReadRequest request;
    ReadDone done;
  };

  // Starts the deadline thread.
  explicit PullQueue(std::function<void()> on_deadline);
  PullQueue(const PullQueue&) = delete;
  PullQueue& operator=(const PullQueue&) = delete;
  // Stop() if not yet.
  ~PullQueue();
  // Ends the deadline thread (on_deadline is not called after this returns). Idempotent. Call it
  // without the owner's lock.
  void Stop();

  // Adds a pull; returns its ticket (> 0).
  int64_t Add(Waiter waiter);
  // Removes the pull of `ticket`; nullopt if it is not waiting (answered already).
  std::optional<Waiter> Remove(int64_t ticket);
  // Offers each waiting pull to `answer`, which answers it and returns true, or returns false to
  // leave it waiting; the answered ones are removed.
  void AnswerEach(absl::FunctionRef<bool(Waiter&)> answer);
  int size() const;

 private:
  void Loop();

  const std::function<void()> on_deadline_;
  mutable absl::Mutex mu_;
  std::map<int64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);  // by ticket
  int64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  bool changed_ ABSL_GUARDED_BY(mu_) = false;  // the earliest deadline may have moved
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ps
