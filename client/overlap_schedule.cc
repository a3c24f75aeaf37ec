#include "client/overlap_schedule.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/time/clock.h"

namespace ps {

OverlapSchedule::OverlapSchedule(ShardedClient* client,
                                 ShardedClient::Pending<ShardedClient::Versions> pull,
                                 absl::Span<const float> gradient, Callbacks callbacks)
    : client_(client),
      pull_(std::move(pull)),
      gradient_(gradient),
      callbacks_(std::move(callbacks)),
      sent_(client->num_shards(), false),
      filled_from_(client->model().total_params) {}

std::optional<absl::Status> OverlapSchedule::WeightsNeeded(int64_t begin, int64_t end,
                                                           absl::Duration timeout) {
  if (pulled_) return absl::OkStatus();
  const absl::Time start = absl::Now();
  failed_call_ = "pull";
  std::optional<absl::Status> s = pull_.WaitValues(begin, end, timeout);
  pull_wait_ += absl::Now() - start;
  return s;
}

absl::Status OverlapSchedule::WeightsNeeded(int64_t begin, int64_t end) {
  return *WeightsNeeded(begin, end, absl::InfiniteDuration());
}

std::optional<absl::Status> OverlapSchedule::WaitPull(absl::Duration timeout) {
  if (pulled_) return absl::OkStatus();
  const absl::Time start = absl::Now();
  failed_call_ = "pull";
  std::optional<absl::Status> s = pull_.WaitValues(0, client_->model().total_params, timeout);
  if (s.has_value() && s->ok()) {
    if (!pull_.Done(start + timeout - absl::Now())) {
      s = std::nullopt;
    } else {
      absl::StatusOr<ShardedClient::Versions> versions = pull_.Wait();  // the answers, at once
      s = versions.status();
      if (versions.ok()) {
        versions_ = *std::move(versions);
        pulled_ = true;
        if (callbacks_.pulled) callbacks_.pulled();
      }
    }
  }
  pull_wait_ += absl::Now() - start;
  return s;
}

absl::Status OverlapSchedule::WaitPull() { return *WaitPull(absl::InfiniteDuration()); }

absl::Status OverlapSchedule::GradientFinal(int64_t begin, int64_t end) {
  if (!push_.valid()) {
    // The forward pass is over, so the pull was waited for: the push's base is known.
    if (absl::Status s = WaitPull(); !s.ok()) return s;
    failed_call_ = "push";
    if (callbacks_.before_push) {
      if (absl::Status s = callbacks_.before_push(); !s.ok()) return s;
    }
    push_ =
        client_->StartPush(gradient_, ShardedClient::kNextSequence, ShardedClient::Parts::kHeld);
  }
  // Values [from, total) are final: a shard's part goes as they come where the shard takes that,
  // else once they cover its range.
  const int64_t from = MarkFinal(begin, end);
  if (from < filled_from_) {
    filled_from_ = from;
    push_.Filled(from);
  }
  SendFinalParts();
  return absl::OkStatus();
}

int64_t OverlapSchedule::MarkFinal(int64_t begin, int64_t end) {
  if (begin < end) {
    auto it = final_.upper_bound(begin);
    if (it != final_.begin() && std::prev(it)->second >= begin) {
      --it;
      begin = it->first;
    }
    while (it != final_.end() && it->first <= end) {
      end = std::max(end, it->second);
      it = final_.erase(it);
    }
    final_[begin] = end;
  }
  const int64_t total = client_->model().total_params;
  return !final_.empty() && final_.rbegin()->second >= total ? final_.rbegin()->first : total;
}

void OverlapSchedule::SendFinalParts() {
  for (int s = 0; s < static_cast<int>(sent_.size()); ++s) {
    if (sent_[s]) continue;
    const Range r = client_->shard_range(s);
    if (r.begin >= filled_from_) {  // Filled sent it
      sent_[s] = true;
      continue;
    }
    auto it = final_.upper_bound(r.begin);
    if (it != final_.begin() && std::prev(it)->second >= r.end) {
      push_.Send(s);
      sent_[s] = true;
    }
  }
}

bool OverlapSchedule::Final(int64_t begin, int64_t end) const {
  auto it = final_.upper_bound(begin);
  if (it != final_.begin() && std::prev(it)->second > begin) return true;
  return it != final_.end() && it->first < end;
}

ShardedClient::Pending<ShardedClient::PushSummary> OverlapSchedule::TakePush() {
  push_.SendAll();
  return std::move(push_);
}

}  // namespace ps
