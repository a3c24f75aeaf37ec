#include "trainer/overlapped_step.h"

#include <utility>

namespace ps {

OverlappedStep::OverlappedStep(ShardedClient* client,
                               ShardedClient::Pending<ShardedClient::Versions> pull,
                               absl::Span<const float> gradient, Callbacks callbacks)
    : OverlapSchedule(client, std::move(pull), gradient, std::move(callbacks)),
      total_(static_cast<int64_t>(gradient.size())) {}

Network::LayerHooks OverlappedStep::Hooks() {
  return {.weights_needed =
              [this](int64_t end) { return end >= total_ ? WaitPull() : WeightsNeeded(0, end); },
          .gradient_final = [this](int64_t begin) { return GradientFinal(begin, total_); }};
}

}  // namespace ps
