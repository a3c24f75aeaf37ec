#include "deploy/kill_plan.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ps {

std::string Kill::Name() const {
  return absl::StrCat(role == Role::kWorker ? "worker " : "shard ", index);
}

absl::StatusOr<std::vector<Kill>> ParseKillPlan(const std::string& text, int shards, int workers) {
  std::vector<Kill> plan;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("bad --kill item '", item, "': ", why,
                                                     " (expected worker:R@Ts or ps:S@Ts)"));
    };
    std::vector<absl::string_view> role_rest = absl::StrSplit(item, absl::MaxSplits(':', 1));
    if (role_rest.size() != 2) return bad("no ':'");
    std::vector<absl::string_view> index_at = absl::StrSplit(role_rest[1], absl::MaxSplits('@', 1));
    if (index_at.size() != 2) return bad("no '@'");
    Kill k;
    double seconds = 0;
    if (!absl::SimpleAtoi(index_at[0], &k.index)) return bad("the index is not a number");
    if (!absl::SimpleAtod(absl::StripSuffix(index_at[1], "s"), &seconds) || !(seconds >= 0)) {
      return bad("the time is not a number of seconds >= 0");
    }
    k.at = absl::Seconds(seconds);
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
  std::stable_sort(plan.begin(), plan.end(),
                   [](const Kill& a, const Kill& b) { return a.at < b.at; });
  return plan;
}

}  // namespace ps
