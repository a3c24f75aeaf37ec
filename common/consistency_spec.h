// A consistency model as written (ps --consistency, and the text a shard's Registration gives its
// clients), parsed. Shared by the shards (which rules they apply) and the workers (whether they
// train a local model, and how often they exchange it).
//
//   async          every push applied at once
//   sync           the gradients of a round averaged, then applied once
//   ssp:S          async, but no worker more than S pushes ahead of the slowest (S >= 0)
//   easgd:T[,A]    elastic averaging (Zhang et al. 2015): each worker trains a local model and
//                  every T steps moves it and the centre towards each other by A*(x_i - centre);
//                  A in (0, 1), default 0.9 / workers
//   local:H        local SGD (periodic model averaging): each worker trains a local model for H
//                  steps from the centre, and the round's average change is added to it
// T and H lie in [1, kMaxPeriod].
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps {

struct ConsistencySpec {
  enum class Kind { kAsync, kSync, kSsp, kEasgd, kLocalSgd };
  static constexpr int kMaxPeriod = 1000;

  Kind kind = Kind::kAsync;
  int staleness_bound = 0;  // ssp
  int period = 1;           // easgd: T; local: H
  double alpha = 0;         // easgd; 0: not given (the shard makes it 0.9 / workers)

  // Pushes gather in rounds that close when every active worker's is in (sync, local).
  bool rounds() const { return kind == Kind::kSync || kind == Kind::kLocalSgd; }
  // Workers train a local model and push changes to add to the weights, not gradients (easgd,
  // local).
  bool local_models() const { return kind == Kind::kEasgd || kind == Kind::kLocalSgd; }
};

// Parses the grammar above; INVALID_ARGUMENT naming it otherwise.
absl::StatusOr<ConsistencySpec> ParseConsistencySpec(absl::string_view text);
// The canonical text: ParseConsistencySpec gives `spec` back (alpha to 9 significant digits).
std::string ConsistencyText(const ConsistencySpec& spec);

}  // namespace ps
