#include "server/state/pull_queue.h"

#include <algorithm>

namespace ps {

PullQueue::PullQueue(std::function<void()> on_deadline) : on_deadline_(std::move(on_deadline)) {
  thread_ = std::thread([this] { Loop(); });
}

PullQueue::~PullQueue() { Stop(); }

void PullQueue::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

int64_t PullQueue::Add(Waiter waiter) {
  absl::MutexLock lock(&mu_);
  const int64_t ticket = next_ticket_++;
  waiters_.emplace(ticket, std::move(waiter));
  changed_ = true;  // the thread may need to wake earlier
  return ticket;
}

std::optional<PullQueue::Waiter> PullQueue::Remove(int64_t ticket) {
  absl::MutexLock lock(&mu_);
  auto it = waiters_.find(ticket);
  if (it == waiters_.end()) return std::nullopt;
  std::optional<Waiter> waiter(std::move(it->second));
  waiters_.erase(it);
  return waiter;
}

void PullQueue::AnswerEach(absl::FunctionRef<bool(Waiter&)> answer) {
  absl::MutexLock lock(&mu_);
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    it = answer(it->second) ? waiters_.erase(it) : std::next(it);
  }
}

int PullQueue::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(waiters_.size());
}

void PullQueue::Loop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      absl::Time earliest = absl::InfiniteFuture();
      for (const auto& [ticket, w] : waiters_) earliest = std::min(earliest, w.request.deadline);
      changed_ = false;
      auto wake = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || changed_; };
      // Woken by a change (an earlier deadline may have come): only look again.
      if (mu_.AwaitWithDeadline(absl::Condition(&wake), earliest) && !stopping_) continue;
      if (stopping_) return;
    }
    on_deadline_();  // those past their deadline get their answer
  }
}

}  // namespace ps
