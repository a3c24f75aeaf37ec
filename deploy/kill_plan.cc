#include "deploy/kill_plan.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ps {

std::string Kill::Name() const {
  return absl::StrCat(role == Role::kWorker ? "worker " : "shard ", index);
}

std::string Kill::When() const {
  switch (unit) {
    case Unit::kSeconds:
      return absl::StrCat("at ", at, " s");
    case Unit::kSteps:
      return absl::StrCat("after ", at, " steps");
    case Unit::kUpdates:
      return absl::StrCat("after ", at, " updates");
  }
  return "";
}

bool Kill::Due(const RunProgress& p) const {
  switch (unit) {
    case Unit::kSeconds:
      return p.seconds >= at;
    case Unit::kSteps:
      return p.steps >= at;
    case Unit::kUpdates:
      return p.updates >= at;
  }
  return false;
}

absl::StatusOr<std::vector<Kill>> ParseKillPlan(const std::string& text, int shards, int workers) {
  std::vector<Kill> plan;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad --kill item '", item, "': ", why,
                       " (expected worker:R@WHEN or ps:S@WHEN, WHEN as 30s, 300steps or 800u)"));
    };
    std::vector<absl::string_view> role_rest = absl::StrSplit(item, absl::MaxSplits(':', 1));
    if (role_rest.size() != 2) return bad("no ':'");
    std::vector<absl::string_view> index_at = absl::StrSplit(role_rest[1], absl::MaxSplits('@', 1));
    if (index_at.size() != 2) return bad("no '@'");
    Kill k;
    if (!absl::SimpleAtoi(index_at[0], &k.index)) return bad("the index is not a number");
    absl::string_view when = index_at[1];
    // Longest suffix first: "steps" and "updates" end in 's'.
    if (absl::ConsumeSuffix(&when, "steps")) {
      k.unit = Kill::Unit::kSteps;
    } else if (absl::ConsumeSuffix(&when, "updates") || absl::ConsumeSuffix(&when, "u")) {
      k.unit = Kill::Unit::kUpdates;
    } else {
      absl::ConsumeSuffix(&when, "s");
      k.unit = Kill::Unit::kSeconds;
    }
    if (!absl::SimpleAtod(when, &k.at) || !(k.at >= 0) || std::isinf(k.at)) {
      return bad("the trigger is not a number >= 0 followed by s, steps or u");
    }
    if (role_rest[0] == "worker") {
      k.role = Kill::Role::kWorker;
      if (k.index < 0 || k.index >= workers) return bad(absl::StrCat("no worker ", k.index));
    } else if (role_rest[0] == "ps") {
      k.role = Kill::Role::kShard;
      if (k.index < 0 || k.index >= shards) return bad(absl::StrCat("no shard ", k.index));
    } else {
      return bad("the role is neither worker nor ps");
    }
    plan.push_back(k);
  }
  return plan;
}

}  // namespace ps
