#include "server/replication/replication_log.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ps {

void ReplicationLog::Append(const ShardChange& change,
                            absl::FunctionRef<bool(int64_t attachment)> held) {
  absl::MutexLock lock(&mu_);
  appended_ = change.index;
  if (attachment_ == 0) return;
  const bool kept = change.forward_tag == 0 || !held(attachment_);
  auto entry =
      std::make_shared<Entry>(Entry{change, buffers_.Acquire(kept ? change.values.size() : 0),
                                    static_cast<int64_t>(change.values.size())});
  if (kept) std::copy(change.values.begin(), change.values.end(), entry->values.span().begin());
  entry->change.values = entry->values.span();
  entries_.push_back(std::move(entry));
}

int64_t ReplicationLog::Attach() {
  absl::MutexLock lock(&mu_);
  if (closed_) return 0;
  entries_.clear();
  started_ = false;
  attachment_ = next_attachment_++;
  return attachment_;
}

void ReplicationLog::Start(int64_t attachment, int64_t index) {
  absl::MutexLock lock(&mu_);
  if (attachment != attachment_) return;
  while (!entries_.empty() && entries_.front()->change.index <= index) entries_.pop_front();
  started_ = true;
}

absl::StatusOr<std::optional<std::shared_ptr<const ReplicationLog::Entry>>> ReplicationLog::Next(
    int64_t attachment, int64_t after, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return attachment != attachment_ ||
           (!entries_.empty() && entries_.back()->change.index > after);
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (attachment != attachment_) return absl::CancelledError("the backup was detached");
  for (const std::shared_ptr<const Entry>& e : entries_) {
    if (e->change.index > after) return std::optional(e);
  }
  return std::nullopt;
}

void ReplicationLog::Acknowledge(int64_t attachment, int64_t index) {
  absl::MutexLock lock(&mu_);
  if (attachment != attachment_ || !started_) return;
  acknowledged_ = std::max(acknowledged_, std::min(index, appended_));
  while (!entries_.empty() && entries_.front()->change.index <= acknowledged_) {
    entries_.pop_front();
  }
}

void ReplicationLog::Detach(int64_t attachment) {
  absl::MutexLock lock(&mu_);
  if (attachment != attachment_) return;
  attachment_ = 0;
  started_ = false;
  entries_.clear();
}

bool ReplicationLog::attached() const {
  absl::MutexLock lock(&mu_);
  return attachment_ != 0;
}

absl::Status ReplicationLog::WaitReplicated(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  const int64_t target = appended_;
  const int64_t attachment = attachment_;
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return acknowledged_ >= target || attachment_ != attachment || attachment_ == 0;
  };
  mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  if (acknowledged_ >= target) return absl::OkStatus();
  return absl::UnavailableError(
      attachment_ == 0 || attachment_ != attachment
          ? "the backup went away before it had this change: not acknowledged, try again"
          : absl::StrCat("the backup has not acknowledged change ", target, " in time"));
}

void ReplicationLog::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  attachment_ = 0;
  started_ = false;
  entries_.clear();
}

}  // namespace ps
