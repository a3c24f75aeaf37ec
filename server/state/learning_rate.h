// The learning rate as a function of the shard's applied-update count: linear warm-up, then
// constant, step decay or cosine decay. Immutable, so thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ps {

struct LearningRateConfig {
  float base = 0.01f;
  std::string schedule = "constant";  // constant | step | cosine
  int64_t warmup_updates = 0;         // linear ramp from base/warmup to base
  int64_t step_updates = 1000;        // step: multiply by gamma every step_updates
  float gamma = 0.5f;
  int64_t total_updates = 10000;  // cosine: reaches 0 here, stays there
};

class LearningRateSchedule {
 public:
  // Validates the configuration (positive base, known schedule, sane periods).
  static absl::StatusOr<LearningRateSchedule> Create(const LearningRateConfig& config);
  // The rate for the update that follows `updates` applied ones.
  float At(int64_t updates) const;
  const LearningRateConfig& config() const { return config_; }

 private:
  explicit LearningRateSchedule(LearningRateConfig c) : config_(std::move(c)) {}
  LearningRateConfig config_;
};

}  // namespace ps
