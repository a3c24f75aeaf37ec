// Seeded artificial delays for straggler and network experiments. A spec is "" (none),
// "fixed:S", "uniform:A,B" or "exp:MEAN", in seconds. Not thread-safe.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ps {

class Delay {
 public:
  // Fails naming the spec if it is malformed or has negative times.
  static absl::StatusOr<Delay> Parse(const std::string& spec, uint64_t seed);
  // No delay.
  Delay() : Delay(Kind::kNone, 0, 0, 0) {}

  bool enabled() const { return kind_ != Kind::kNone; }
  // The next delay drawn from the distribution.
  absl::Duration Next();

 private:
  enum class Kind { kNone, kFixed, kUniform, kExponential };
  Delay(Kind kind, double a, double b, uint64_t seed) : kind_(kind), a_(a), b_(b), rng_(seed) {}

  Kind kind_;
  double a_, b_;
  std::mt19937_64 rng_;
};

}  // namespace ps
