#include "worker/overlapped_step.h"

#include <utility>

#include "absl/time/clock.h"

namespace ps {

OverlappedStep::OverlappedStep(ShardedClient* client,
                               ShardedClient::Pending<ShardedClient::Versions> pull,
                               absl::Span<const float> gradient, Callbacks callbacks)
    : client_(client),
      pull_(std::move(pull)),
      gradient_(gradient),
      callbacks_(std::move(callbacks)) {
  for (int s = 0; s < client_->num_shards(); ++s) ranges_.push_back(client_->shard_range(s));
}

Network::LayerHooks OverlappedStep::Hooks() {
  return {.weights_needed = [this](int64_t end) { return WeightsNeeded(end); },
          .gradient_final = [this](int64_t begin) { return GradientFinal(begin); }};
}

absl::Status OverlappedStep::WeightsNeeded(int64_t end) {
  const absl::Time start = absl::Now();
  failed_call_ = "pull";
  const int shards = static_cast<int>(ranges_.size());
  // Shards hold consecutive ranges: params[0, end) is in every shard that begins before end.
  for (; arrived_ < shards && ranges_[arrived_].begin < end; ++arrived_) {
    if (absl::Status s = pull_.WaitPart(arrived_); !s.ok()) return s;
  }
  if (arrived_ == shards && !pulled_) {
    absl::StatusOr<ShardedClient::Versions> versions = pull_.Wait();  // every part is in: at once
    if (!versions.ok()) return versions.status();
    versions_ = *std::move(versions);
    pulled_ = true;
    if (callbacks_.pulled) callbacks_.pulled();
  }
  pull_wait_ += absl::Now() - start;
  return absl::OkStatus();
}

absl::Status OverlappedStep::GradientFinal(int64_t begin) {
  if (!push_.valid()) {
    // The forward pass is over, so the pull was waited for: the push's base is known.
    if (absl::Status s = WeightsNeeded(client_->model().total_params); !s.ok()) return s;
    failed_call_ = "push";
    if (callbacks_.before_push) {
      if (absl::Status s = callbacks_.before_push(); !s.ok()) return s;
    }
    push_ =
        client_->StartPush(gradient_, ShardedClient::kNextSequence, ShardedClient::Parts::kHeld);
  }
  // Values [begin, end) are final: a shard's part goes as they come where the shard takes that,
  // else once backward passed its first element.
  push_.Filled(begin);
  return absl::OkStatus();
}

ShardedClient::Pending<ShardedClient::PushSummary> OverlappedStep::TakePush() {
  push_.SendAll();
  return std::move(push_);
}

}  // namespace ps
