// The round being gathered under sync and local:H: the sum of the workers' pushed vectors for one
// version, added in rank (worker id) order whatever order they arrive in, so that the same pushes
// give the same sum bit for bit run after run (float addition is not associative). The sum is the
// rank-ordered prefix of the pushes folded so far; a push that arrives while a lower-ranked worker
// may still push is held (copied into a buffer kept across rounds) until those are in, then
// folded; the close folds what is still held (pushes after a worker that expired or that a
// backup worker's round closed without), in rank order.
// Memory: the sum and at most num_workers - 1 held pushes, each of the shard's size; the held
// buffers are reused from round to round and freed by Trim once unused.
// Not thread-safe: ParameterShard guards it with its lock.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/state/buffer_pool.h"

namespace ps {

class Round {
 public:
  // Whether worker `id`, not in the round, may still push to it (it has not registered yet, or
  // it is active): a higher rank's push waits for it.
  using Expected = absl::FunctionRef<bool(int id)>;

  // A round of vectors of `size` values from workers [0, num_workers).
  Round(int64_t size, int num_workers);

  // Whether some worker pushed to it.
  bool open() const { return !contributors_.empty(); }
  // The workers whose pushes it holds, folded or not.
  const std::set<int>& contributors() const { return contributors_; }
  // Those of them restored from a checkpoint (Restore), until it closes.
  const std::set<int>& restored() const { return restored_; }

  // Adds worker `id`'s `values` (the round's size; `id` not a contributor yet): folded at once,
  // with the held pushes it lets through, when no lower rank is expected; held otherwise.
  // INVALID_ARGUMENT, and nothing changed, if folding them would make the sum non-finite.
  absl::Status Add(int id, absl::Span<const float> values, Expected expected);
  // Folds what is held, in rank order, and returns the sum of every push; the round stays as it
  // is until Clear. The sum may be non-finite (a held push overflowed it): the caller checks.
  absl::Span<float> Fold();
  // Empties the round for the next version (keeping its buffers).
  void Clear();
  // The sum Fold would return, into `out`, without changing the round (checkpoints).
  void SaveSum(std::vector<float>* out) const;
  // Replaces the round with a saved one: `sum` (the round's size) of `contributors`, all folded.
  void Restore(std::vector<float> sum, std::set<int> contributors);
  // Frees the held pushes' idle buffers unused for `unused`.
  void Trim(absl::Duration unused) { buffers_.Trim(unused); }

 private:
  // Whether every rank below `id` is folded or no longer expected.
  bool InTurn(int id, Expected expected) const;

  const int64_t size_;
  const int num_workers_;
  std::vector<float> sum_;  // sized when the first push comes
  std::set<int> contributors_;
  std::set<int> restored_;
  std::map<int, BufferPool::Lease> held_;  // by rank: pushes waiting for a lower rank's
  BufferPool buffers_;
};

}  // namespace ps
