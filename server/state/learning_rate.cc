#include "server/state/learning_rate.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace ps {

absl::StatusOr<LearningRateSchedule> LearningRateSchedule::Create(const LearningRateConfig& c) {
  if (!(c.base > 0) || !std::isfinite(c.base)) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning rate must be a positive number, got ", c.base));
  }
  if (c.warmup_updates < 0) return absl::InvalidArgumentError("warm-up updates must be >= 0");
  if (c.schedule == "step" && (c.step_updates <= 0 || !(c.gamma > 0 && c.gamma <= 1))) {
    return absl::InvalidArgumentError("step schedule needs step_updates > 0 and gamma in (0, 1]");
  }
  if (c.schedule == "cosine" && c.total_updates <= c.warmup_updates) {
    return absl::InvalidArgumentError("cosine schedule needs total_updates > warmup_updates");
  }
  if (c.schedule != "constant" && c.schedule != "step" && c.schedule != "cosine") {
    return absl::InvalidArgumentError(absl::StrCat("unknown learning-rate schedule '", c.schedule,
                                                   "': expected constant, step or cosine"));
  }
  return LearningRateSchedule(c);
}

float LearningRateSchedule::At(int64_t updates) const {
  const LearningRateConfig& c = config_;
  if (updates < c.warmup_updates) {
    return c.base * static_cast<float>(updates + 1) / static_cast<float>(c.warmup_updates);
  }
  if (c.schedule == "step") {
    return c.base * std::pow(c.gamma, static_cast<float>(updates / c.step_updates));
  }
  if (c.schedule == "cosine") {
    double progress = std::min(1.0, static_cast<double>(updates - c.warmup_updates) /
                                        static_cast<double>(c.total_updates - c.warmup_updates));
    return static_cast<float>(c.base * 0.5 * (1 + std::cos(M_PI * progress)));
  }
  return c.base;
}

}  // namespace ps
