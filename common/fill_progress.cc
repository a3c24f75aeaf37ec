#include "common/fill_progress.h"

#include <algorithm>

namespace ps {

void FillProgress::Add(int64_t n) {
  absl::MutexLock lock(&mu_);
  filled_ = std::min(total_, filled_ + std::max<int64_t>(n, 0));
}

int64_t FillProgress::WaitFor(int64_t n, absl::Time deadline) const {
  const int64_t want = std::min(n, total_);
  absl::MutexLock lock(&mu_);
  auto enough = [this, want]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return filled_ >= want || stopped_; };
  mu_.AwaitWithDeadline(absl::Condition(&enough), deadline);
  return filled_;
}

void FillProgress::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
}

bool FillProgress::stopped() const {
  absl::MutexLock lock(&mu_);
  return stopped_;
}

}  // namespace ps
