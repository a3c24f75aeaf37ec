#include "server/state/shard_state.h"

#include <algorithm>
#include <cstdint>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/consistency_spec.h"

namespace ps {

const std::vector<float>* ShardState::Find(absl::string_view name) const {
  for (int i = 0; i < header.tensors_size() && i < static_cast<int>(tensors.size()); ++i) {
    if (header.tensors(i) == name) return &tensors[i];
  }
  return nullptr;
}

std::vector<float>& ShardState::AddTensor(std::string name) {
  header.add_tensors(std::move(name));
  if (tensors.size() < static_cast<size_t>(header.tensors_size())) tensors.emplace_back();
  return tensors[header.tensors_size() - 1];
}

absl::Status CheckStateShape(const ShardState& state, int64_t size) {
  if (state.header.tensors_size() > kMaxStateTensors) {
    return absl::InvalidArgumentError(absl::StrCat("the state names ", state.header.tensors_size(),
                                                   " tensors, more than ", kMaxStateTensors));
  }
  std::set<std::string> seen;
  for (int i = 0; i < state.header.tensors_size(); ++i) {
    const std::string& name = state.header.tensors(i);
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError("the state names tensor " + name + " twice");
    }
    if (i >= static_cast<int>(state.tensors.size()) ||
        static_cast<int64_t>(state.tensors[i].size()) != size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the state's tensor ", name, " does not hold the shard's ", size, " values"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckStateInvariants(const ShardState& state) {
  const v1::ShardState& h = state.header;
  auto bad = [](auto&&... why) { return absl::DataLossError(absl::StrCat(why...)); };
  const std::vector<float>* values = state.Find(kValuesTensor);
  if (values == nullptr) return bad("the state holds no values");
  for (int i = 0; i < h.tensors_size(); ++i) {
    if (i >= static_cast<int>(state.tensors.size()) || state.tensors[i].size() != values->size()) {
      return bad("tensor ", h.tensors(i), " is not as long as the values (", values->size(), ")");
    }
  }
  if (h.version() < 0) return bad("version ", h.version(), " is negative");
  if (h.changes() < 0) return bad("change count ", h.changes(), " is negative");
  absl::StatusOr<ConsistencySpec> consistency = ParseConsistencySpec(h.consistency());
  if (!consistency.ok()) return bad("consistency: ", consistency.status().message());
  std::set<int> ids;
  __int128 applied = 0;  // a sum of int64s: no overflow on hostile values
  for (const v1::WorkerState& w : h.workers()) {
    if (!ids.insert(w.id()).second) return bad("worker ", w.id(), " is listed twice");
    if (w.last_sequence() < -1 || w.clock() < 0 || w.pushes_applied() < 0 || w.incarnation() < 0) {
      return bad("worker ", w.id(), " has a last_sequence below -1 or a negative clock, ",
                 "pushes_applied or incarnation");
    }
    if (w.pushes_applied() > w.clock()) {
      return bad("worker ", w.id(), " applied ", w.pushes_applied(), " pushes but its clock is ",
                 w.clock());
    }
    if (w.joined_at_version() < 0 || w.joined_at_version() > h.version()) {
      return bad("worker ", w.id(), " joined at version ", w.joined_at_version(), ", outside [0, ",
                 h.version(), "]");
    }
    applied += w.pushes_applied();
  }
  if (!consistency->rounds() && applied != h.version()) {
    return bad("version ", h.version(), " disagrees with the ",
               static_cast<int64_t>(std::min<__int128>(applied, INT64_MAX)),
               " pushes its workers applied (under ", h.consistency(),
               " each applied push is one update)");
  }
  for (int id : h.round_contributors()) {
    if (!consistency->rounds()) return bad("a round is open under ", h.consistency());
    if (ids.count(id) == 0) return bad("round contributor ", id, " is not a listed worker");
  }
  return absl::OkStatus();
}

}  // namespace ps
