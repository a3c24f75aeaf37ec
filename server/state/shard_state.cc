#include "server/state/shard_state.h"

#include <set>

#include "absl/strings/str_cat.h"

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

}  // namespace ps
