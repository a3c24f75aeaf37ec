#include "trainer/overlapped_step.h"

#include <utility>

#include "absl/time/clock.h"

namespace ps {

OverlappedStep::OverlappedStep(ShardedClient* client,
                               ShardedClient::Pending<ShardedClient::Versions> pull,
                               absl::Span<const float> gradient, Callbacks callbacks)
    : client_(client),
      pull_(std::move(pull)),
      gradient_(gradient),
      callbacks_(std::move(callbacks)) {}

Network::LayerHooks OverlappedStep::Hooks() {
  return {.weights_needed = [this](int64_t end) { return WeightsNeeded(end); },
          .gradient_final = [this](int64_t begin) { return GradientFinal(begin); }};
}

absl::Status OverlappedStep::WeightsNeeded(int64_t end) {
  if (pulled_) return absl::OkStatus();
  const absl::Time start = absl::Now();
  failed_call_ = "pull";
  absl::Status s = pull_.WaitValues(0, end);
  if (s.ok() && end >= client_->model().total_params) {
    absl::StatusOr<ShardedClient::Versions> versions = pull_.Wait();  // the answers, at once
    s = versions.status();
    if (s.ok()) {
      versions_ = *std::move(versions);
      pulled_ = true;
      if (callbacks_.pulled) callbacks_.pulled();
    }
  }
  pull_wait_ += absl::Now() - start;
  return s;
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
