// The values of a shard's range and its optimizer's state: what updates change and pulls copy.
// Thread-safety: Copy and Read may be called from any thread at any time; they take the values'
// lock shared, so copies run side by side and never see an update half done. The methods that
// change the values (Reset, Update, Import) take it exclusively and must be called by one thread
// at a time (ParameterShard calls them under its own lock).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/fill_progress.h"
#include "common/partition.h"
#include "server/state/apply_threads.h"
#include "server/state/buffer_pool.h"
#include "server/state/optimizer.h"
#include "server/state/shard_state.h"

namespace ps {

class ShardValues {
 public:
  // A copy of some of the values and the version they reflect.
  struct Snapshot {
    int64_t version = 0;
    int64_t offset = 0;  // global offset of values[0]
    BufferPool::Lease values;
  };
  // Where a copy goes instead of a snapshot (a pull answered through shared memory): called with
  // the values under the lock (held shared), so it must only copy them.
  using CopyOut = std::function<void(absl::Span<const float> values)>;
  // A snapshot sent while it is copied (a pull over the data plane): called with the snapshot's
  // buffer before it is filled, under the lock (held shared), so it must only queue work; returns
  // what to tell of each piece copied (kept alive by the caller until the buffer is sent; null:
  // copy it whole).
  using Filling = std::function<FillProgress*(absl::Span<const float> buffer)>;

  // Values of `range` updated by `optimizer` (validated: MakeOptimizer accepts it), or, when
  // `add_changes`, changed by adding what is pushed as it is (easgd, local: workers push changes
  // of their models); `apply_threads` apply one update together. The optimizer trains the first
  // `trained` values (<= the range's size); the rest are a layout's buffers, which an update sets
  // to what is pushed (or, when `add_changes`, adds it to, as the weights).
  ShardValues(Range range, int64_t trained, OptimizerConfig optimizer, bool add_changes,
              int apply_threads);

  // Sets the values to `values` (the range's size) as of `version`, with a fresh optimizer state.
  void Reset(absl::Span<const float> values, int64_t version);
  // Applies `gradient` (the range's size) at rate `lr` as the update after `version` (the
  // optimizer's step on the trained values, whose buffers take the pushed values; see
  // Optimizer::Apply for `max_abs`), or adds it. All or nothing:
  // INVALID_ARGUMENT, and nothing changed, if a value would become non-finite. Then the values
  // reflect version + 1.
  absl::Status Update(absl::Span<const float> gradient, float lr, int64_t version, float max_abs);
  // Takes the values and the optimizer's slots from `state` (kValuesTensor, the range's size, and
  // kOptimizerTensorPrefix + slot, the trained values' size) as of `version`; INVALID_ARGUMENT
  // naming what is missing, and nothing changed, otherwise.
  absl::Status Import(const ShardState& state, int64_t version);

  // Adds the values and the optimizer's slots to `out` as tensors (copies into out's storage).
  // Requires an initialised shard (Reset or Import first).
  void Export(ShardState* out) const;
  // Calls fn(values) under the lock held shared (DC-ASGD reads the weights).
  void Read(absl::FunctionRef<void(absl::Span<const float>)> fn) const;
  // A snapshot of [offset, offset + length) (inside the range); with `copy_out` the values go
  // there instead, unless `keep_copy` asks for the snapshot too. With `filling` (and no
  // `copy_out`), the snapshot is announced before it is filled, and filled in pieces.
  Snapshot Copy(int64_t offset, int64_t length, const CopyOut& copy_out, bool keep_copy,
                const Filling& filling = nullptr);
  // Frees idle snapshot buffers unused for `unused`.
  void Trim(absl::Duration unused) { snapshot_buffers_.Trim(unused); }

 private:
  const Range range_;
  const int64_t trained_;
  const OptimizerConfig optimizer_config_;
  const bool add_changes_;
  mutable absl::Mutex mu_;
  std::vector<float> weights_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Optimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;  // the version weights_ reflect
  ApplyThreads apply_threads_;
  BufferPool snapshot_buffers_{2};  // at most two idle ones kept between pulls
};

}  // namespace ps
