// A shard's whole state as one value: the header of the one state schema
// (proto/shard_state.proto: model, place, optimizer, consistency model, version, workers, open
// round) and the tensors it names. ParameterShard::Checkpoint fills one and Restore takes one;
// CheckpointStore writes and reads it as a file; a primary sends one to a joining backup
// (StateMessages, StateReceiver), so every field of the schema reaches all three.
// Not thread-safe: a value.
#pragma once

#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/shard_state.pb.h"

namespace ps {

// Tensor names.
inline constexpr char kValuesTensor[] = "values";
inline constexpr char kOptimizerTensorPrefix[] = "optimizer.";  // then the optimizer's slot
inline constexpr char kRoundSumTensor[] = "round.sum";

struct ShardState {
  v1::ShardState header;
  // tensors[i] holds header.tensors(i)'s values. It may hold more entries than the header names
  // (storage kept from an earlier fill, reused by AddTensor): only the named ones are the state.
  std::vector<std::vector<float>> tensors;

  // Whether the state holds a model (it names a tensor).
  bool has_model() const { return header.tensors_size() > 0; }
  // The tensor named `name`, or null.
  const std::vector<float>* Find(absl::string_view name) const;
  // Forgets the tensors' names, keeping their storage for the next fill.
  void ClearTensors() { header.clear_tensors(); }
  // Names the next tensor `name` and returns its storage (kept from an earlier fill if any).
  std::vector<float>& AddTensor(std::string name);
};

// The most tensors a state may name (values, up to two optimizer slots, a round's sum, and room):
// a state received names no more, so that a header cannot make a backup allocate without bound.
inline constexpr int kMaxStateTensors = 8;

// Checks what can be checked of a state without a shard: at most kMaxStateTensors distinct
// names, each tensor present and of `size` values. INVALID_ARGUMENT naming the problem.
absl::Status CheckStateShape(const ShardState& state, int64_t size);

// Checks what every state a shard holds satisfies, whatever its history (initialisation, pushes,
// restores from older checkpoints, a backup repeating its primary), so that a state edited or
// damaged yet whole (its checksum recomputed) is refused like a corrupt one. DATA_LOSS naming the
// first disagreement. The invariants:
//   - a model: "values", and every tensor as long as it;
//   - version and changes >= 0; a consistency model that parses;
//   - each worker listed once, with last_sequence >= -1, clock, pushes_applied and incarnation
//     >= 0, pushes_applied <= clock (the clock counts every push taken, applied or not, and only
//     ever moves up), joined_at_version in [0, version];
//   - async, ssp, easgd: version == the sum of the workers' pushes_applied. Only a push applied
//     at once is an update there, and it counts for its worker in the same step, on a primary
//     and on a backup repeating it alike; a restore carries both over, and these models are
//     restored only from each other's states (ParameterShard::Restore). Under sync and local no
//     such relation holds: a round counts a push per contributor and one update when it closes,
//     a discarded (non-finite) round counts its pushes and no update, and a backup repeats a
//     round's update without its pushes;
//   - round contributors: listed workers, under sync or local only.
// Needs no shard: ParameterShard::Restore checks what this shard's settings require on top.
absl::Status CheckStateInvariants(const ShardState& state);

}  // namespace ps
