#include "server/rpc/call_limits.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ps {

CallLimit::Slot& CallLimit::Slot::operator=(Slot&& o) noexcept {
  if (this != &o) {
    this->~Slot();
    limit_ = o.limit_;
    worker_ = o.worker_;
    o.limit_ = nullptr;
  }
  return *this;
}

CallLimit::Slot::~Slot() {
  if (limit_ == nullptr) return;
  absl::MutexLock lock(&limit_->mu_);
  --limit_->in_use_;
  if (worker_ != Caller::kAnyWorker && --limit_->by_worker_[worker_] == 0) {
    limit_->by_worker_.erase(worker_);
  }
}

absl::StatusOr<CallLimit::Slot> CallLimit::TryAcquire(int worker) {
  absl::MutexLock lock(&mu_);
  if (in_use_ >= max_calls_) {
    ++refused_;
    return absl::ResourceExhaustedError(absl::StrCat("this shard already serves ", max_calls_, " ",
                                                     what_, " at once; try again later"));
  }
  const bool counted = worker != Caller::kAnyWorker;
  if (counted && max_per_worker_ > 0) {
    auto it = by_worker_.find(worker);
    if (it != by_worker_.end() && it->second >= max_per_worker_) {
      ++refused_;
      return absl::ResourceExhaustedError(
          absl::StrCat(worker >= 0 ? absl::StrCat("worker ", worker, " already has ")
                                   : std::string("the job's observers and operator already have "),
                       max_per_worker_, " ", what_,
                       " at this shard, the most at once (ps --max_calls_per_worker)"));
    }
  }
  ++in_use_;
  if (counted) ++by_worker_[worker];
  return Slot(this, counted ? worker : Caller::kAnyWorker);
}

int64_t CallLimit::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

int CallLimit::in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

StreamWatchdog::StreamWatchdog(absl::Duration idle, absl::Duration total)
    : idle_(idle), total_(total), thread_([this] { Loop(); }) {}

StreamWatchdog::~StreamWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

StreamWatchdog::Guard StreamWatchdog::Watch(grpc::ServerContextBase* context) {
  absl::MutexLock lock(&mu_);
  absl::Time now = absl::Now();
  calls_.emplace(next_id_, Entry{context, now, now});
  return Guard(this, next_id_++);
}

StreamWatchdog::Guard::~Guard() {
  if (dog_ == nullptr) return;
  absl::MutexLock lock(&dog_->mu_);
  dog_->calls_.erase(id_);
}

void StreamWatchdog::Guard::Progress() {
  absl::MutexLock lock(&dog_->mu_);
  dog_->calls_.at(id_).last_progress = absl::Now();
}

void StreamWatchdog::Loop() {
  // Checks a few times per idle period: a stalled call lives at most ~1.25 x the limit.
  const absl::Duration tick =
      std::clamp(std::min(idle_, total_) / 4, absl::Milliseconds(10), absl::Seconds(1));
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), tick)) {
    absl::Time now = absl::Now();
    for (auto& [id, call] : calls_) {
      if (!call.cancelled && (now - call.last_progress > idle_ || now - call.started > total_)) {
        // Under the lock, so the guard (and its call) cannot be gone. gRPC runs callback reactions
        // on its executor, never inside TryCancel, so none of them runs under this lock.
        call.cancelled = true;
        call.context->TryCancel();
      }
    }
  }
}

}  // namespace ps
