// How much of a buffer one thread has filled so far, for another thread that sends the buffer as
// it fills (a shard copies a pull's values into a snapshot while its data-plane connection sends
// the part already copied). Thread-safe.
#pragma once

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ps {

// Values a filler copies at a time, and a sender waits for at a time (1 MiB of float32): the
// send of one piece overlaps the copy of the next.
inline constexpr int64_t kFillPiece = int64_t{1} << 18;

class FillProgress {
 public:
  // A buffer of `total` values, none of them in place yet.
  explicit FillProgress(int64_t total) : total_(total) {}
  int64_t total() const { return total_; }
  // `n` more values are in place (in the order the sender takes them: from the start, or from
  // the end for ValuesOrder::kLastPieceFirst); at most total() in all.
  void Add(int64_t n);
  // Waits until at least min(n, total()) values are in place, or `deadline`, or Stop; returns
  // how many are.
  int64_t WaitFor(int64_t n, absl::Time deadline) const;
  // No more values will come (the filler gave up): waits end at once.
  void Stop();
  bool stopped() const;

 private:
  const int64_t total_;
  mutable absl::Mutex mu_;
  int64_t filled_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ps
