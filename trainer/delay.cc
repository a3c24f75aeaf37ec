#include "trainer/delay.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ps {

absl::StatusOr<Delay> Delay::Parse(const std::string& spec, uint64_t seed) {
  if (spec.empty() || spec == "none") return Delay(Kind::kNone, 0, 0, seed);
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad delay '", spec, "': expected fixed:S, uniform:A,B or exp:MEAN (seconds, >= 0)"));
  };
  std::vector<std::string> kind_args = absl::StrSplit(spec, absl::MaxSplits(':', 1));
  if (kind_args.size() != 2) return bad();
  std::vector<double> args;
  for (absl::string_view a : absl::StrSplit(kind_args[1], ',')) {
    double v = 0;
    if (!absl::SimpleAtod(a, &v) || !(v >= 0)) return bad();
    args.push_back(v);
  }
  const std::string& kind = kind_args[0];
  if (kind == "fixed" && args.size() == 1) return Delay(Kind::kFixed, args[0], 0, seed);
  if (kind == "uniform" && args.size() == 2 && args[0] <= args[1]) {
    return Delay(Kind::kUniform, args[0], args[1], seed);
  }
  if (kind == "exp" && args.size() == 1) return Delay(Kind::kExponential, args[0], 0, seed);
  return bad();
}

absl::Duration Delay::Next() {
  switch (kind_) {
    case Kind::kFixed:
      return absl::Seconds(a_);
    case Kind::kUniform:
      return absl::Seconds(std::uniform_real_distribution<double>(a_, b_)(rng_));
    case Kind::kExponential:
      return a_ > 0 ? absl::Seconds(std::exponential_distribution<double>(1 / a_)(rng_))
                    : absl::ZeroDuration();
    default:
      return absl::ZeroDuration();
  }
}

}  // namespace ps
