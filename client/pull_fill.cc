#include "client/pull_fill.h"

#include <utility>

namespace ps {

PullFill::PullFill(std::vector<Range> ranges)
    : ranges_(std::move(ranges)), parts_(ranges_.size()) {}

bool PullFill::Attempt(int shard) {
  absl::MutexLock lock(&mu_);
  return !parts_[shard].used;  // a failed attempt's values were forgotten at Failed
}

void PullFill::Failed(int shard) {
  absl::MutexLock lock(&mu_);
  Part& part = parts_[shard];
  if (part.used) return;
  part.prefix = 0;
  part.ahead.clear();
}

void PullFill::InPlace(int shard, int64_t offset, int64_t n) {
  absl::MutexLock lock(&mu_);
  Part& part = parts_[shard];
  part.ahead[offset] = n;
  for (auto next = part.ahead.begin(); next != part.ahead.end() && next->first == part.prefix;
       next = part.ahead.erase(next)) {
    part.prefix += next->second;
  }
}

void PullFill::Ended(int shard) {
  absl::MutexLock lock(&mu_);
  parts_[shard].ended = true;
}

PullFill::Found PullFill::WaitFor(int shard, int64_t n, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  Part& part = parts_[shard];
  auto found = [&part, n] { return part.ended || part.prefix >= n; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&found), timeout)) return Found::kTimedOut;
  if (part.ended) return Found::kEnded;
  part.used = true;
  return Found::kInPlace;
}

}  // namespace ps
