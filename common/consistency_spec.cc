#include "common/consistency_spec.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace ps {

absl::StatusOr<ConsistencySpec> ParseConsistencySpec(absl::string_view text) {
  using Kind = ConsistencySpec::Kind;
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown consistency model '", text, "': ", why,
                     " (expected async, sync, ssp:S with S >= 0, easgd:T[,A] or local:H)"));
  };
  ConsistencySpec spec;
  std::vector<absl::string_view> parts = absl::StrSplit(text, absl::MaxSplits(':', 1));
  const absl::string_view name = parts[0];
  const bool has_args = parts.size() == 2;
  if (name == "async" || name == "sync") {
    if (has_args) return bad(absl::StrCat(name, " takes no parameter"));
    spec.kind = name == "async" ? Kind::kAsync : Kind::kSync;
    return spec;
  }
  if (name != "ssp" && name != "easgd" && name != "local") return bad("no such model");
  if (!has_args) return bad("missing its parameter");
  std::vector<absl::string_view> args = absl::StrSplit(parts[1], ',');
  auto period = [&](absl::string_view arg, int* out) {
    return absl::SimpleAtoi(arg, out) && *out >= 1 && *out <= ConsistencySpec::kMaxPeriod;
  };
  if (name == "ssp") {
    spec.kind = Kind::kSsp;
    if (args.size() != 1 || !absl::SimpleAtoi(args[0], &spec.staleness_bound) ||
        spec.staleness_bound < 0) {
      return bad("S must be an integer >= 0");
    }
  } else if (name == "easgd") {
    spec.kind = Kind::kEasgd;
    if (args.size() > 2 || !period(args[0], &spec.period)) {
      return bad(absl::StrCat("T must be an integer in [1, ", ConsistencySpec::kMaxPeriod, "]"));
    }
    if (args.size() == 2 &&
        (!absl::SimpleAtod(args[1], &spec.alpha) || !(spec.alpha > 0 && spec.alpha < 1))) {
      return bad("A must be a number in (0, 1)");
    }
  } else {
    spec.kind = Kind::kLocalSgd;
    if (args.size() != 1 || !period(args[0], &spec.period)) {
      return bad(absl::StrCat("H must be an integer in [1, ", ConsistencySpec::kMaxPeriod, "]"));
    }
  }
  return spec;
}

std::string ConsistencyText(const ConsistencySpec& spec) {
  switch (spec.kind) {
    case ConsistencySpec::Kind::kSync:
      return "sync";
    case ConsistencySpec::Kind::kSsp:
      return absl::StrCat("ssp:", spec.staleness_bound);
    case ConsistencySpec::Kind::kEasgd:
      return spec.alpha > 0 ? absl::StrFormat("easgd:%d,%.9g", spec.period, spec.alpha)
                            : absl::StrCat("easgd:", spec.period);
    case ConsistencySpec::Kind::kLocalSgd:
      return absl::StrCat("local:", spec.period);
    case ConsistencySpec::Kind::kAsync:
      break;
  }
  return "async";
}

}  // namespace ps
