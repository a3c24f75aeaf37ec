#include "server/state/membership.h"

#include <algorithm>
#include <chrono>
#include <limits>

namespace ps {

absl::Time MonotonicNow() {
  return absl::UnixEpoch() + absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

Membership::Worker& Membership::Touch(int id, absl::Time now, int64_t version) {
  auto [it, is_new] = workers_.try_emplace(id);
  Worker& w = it->second;
  if (is_new || !w.active) {
    w.active = false;  // not part of the minimum it joins at
    int64_t slowest = MinActiveClock();
    if (slowest != std::numeric_limits<int64_t>::max()) w.clock = std::max(w.clock, slowest);
    w.active = true;
    w.stalled = false;
    w.joined_at_version = version;
    w.last_progress = now;
  }
  w.last_seen = now;
  return w;
}

bool Membership::Refresh(int id, absl::Time now, int64_t version) {
  Worker* w = Find(id);
  if (w == nullptr) return false;
  if (w->stalled) {
    w->last_seen = now;
  } else {
    Touch(id, now, version);
  }
  return true;
}

void Membership::Stall(int id) {
  Worker* w = Find(id);
  if (w == nullptr) return;
  w->active = false;
  w->stalled = true;
}

Membership::Worker* Membership::Find(int id) {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

std::vector<int> Membership::Expire(absl::Time now) {
  std::vector<int> expired;
  for (auto& [id, w] : workers_) {
    if (w.active && now - w.last_seen > lease_) {
      w.active = false;
      expired.push_back(id);
    }
  }
  return expired;
}

bool Membership::Leave(int id) {
  Worker* w = Find(id);
  if (w == nullptr) return false;
  w->active = false;
  return true;
}

int Membership::ActiveCount() const {
  return static_cast<int>(std::count_if(workers_.begin(), workers_.end(),
                                        [](const auto& kv) { return kv.second.active; }));
}

int64_t Membership::MinActiveClock() const {
  int64_t slowest = std::numeric_limits<int64_t>::max();
  for (const auto& [id, w] : workers_) {
    if (w.active) slowest = std::min(slowest, w.clock);
  }
  return slowest;
}

}  // namespace ps
