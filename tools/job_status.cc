#include "tools/job_status.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"

namespace ps {

int64_t StalenessQuantile(const v1::StatsResponse& stats, double fraction) {
  int64_t total = 0;
  for (int64_t c : stats.staleness_counts()) total += c;
  if (total == 0) return -1;
  int64_t seen = 0;
  for (int k = 0; k < stats.staleness_counts_size(); ++k) {
    seen += stats.staleness_counts(k);
    if (static_cast<double>(seen) >= fraction * static_cast<double>(total)) return k;
  }
  return stats.staleness_counts_size() - 1;
}

namespace {

// One line naming the build every shard process runs, or, when they differ, a line per process
// under a warning: a job of mixed builds is a likely cause of surprises.
std::string BuildLines(const std::vector<std::string>& addresses,
                       const std::vector<v1::StatsResponse>& now) {
  std::vector<size_t> up;
  for (size_t s = 0; s < now.size(); ++s) {
    if (now[s].replica_role() != "down") up.push_back(s);
  }
  if (up.empty()) return "";
  auto line = [&](size_t s) {
    return now[s].version_line().empty() ? std::string("unknown (an older release)")
                                         : now[s].version_line();
  };
  const bool same = std::all_of(up.begin(), up.end(), [&](size_t s) {
    return now[s].version_line() == now[up[0]].version_line();
  });
  if (same) return absl::StrCat("build: ", line(up[0]), "\n");
  std::string out = "WARNING: the shard processes run different builds:\n";
  for (size_t s : up) {
    absl::StrAppend(&out, "  shard ", now[s].shard_index(), " (",
                    s < addresses.size() ? addresses[s] : "?", "): ", line(s), "\n");
  }
  return out;
}

}  // namespace

std::string StatusTable(const std::vector<std::string>& addresses,
                        const std::vector<v1::StatsResponse>& now,
                        const std::vector<v1::StatsResponse>* before, double seconds) {
  int width = 7;  // the address column fits the longest address
  for (const std::string& a : addresses) width = std::max(width, static_cast<int>(a.size()));
  std::string out = absl::StrFormat("%-5s %-*s %-8s %10s %10s %9s %9s %9s %8s %8s\n", "shard",
                                    width, "address", "role", "version", "updates/s", "workers",
                                    "stale p50", "stale p99", "dropped", "rejected");
  for (size_t s = 0; s < now.size(); ++s) {
    const v1::StatsResponse& n = now[s];
    if (n.replica_role() == "down") {
      absl::StrAppend(&out, absl::StrFormat("%-5d %-*s %-8s\n", n.shard_index(), width,
                                            s < addresses.size() ? addresses[s] : "?", "down"));
      continue;
    }
    std::string rate = "-";
    if (before != nullptr && s < before->size() && seconds > 0 &&
        (*before)[s].replica_role() != "down") {
      rate = absl::StrFormat("%.1f", (n.version() - (*before)[s].version()) / seconds);
    }
    auto quantile = [&](double f) {
      int64_t q = StalenessQuantile(n, f);
      return q < 0 ? std::string("-") : absl::StrCat(q);
    };
    absl::StrAppend(
        &out, absl::StrFormat(
                  "%-5d %-*s %-8s %10d %10s %9s %9s %9s %8d %8d\n", n.shard_index(), width,
                  s < addresses.size() ? addresses[s] : "?",
                  n.replica_role().empty() ? "-" : n.replica_role(), n.version(), rate,
                  absl::StrCat(n.active_workers(), "/", n.registered_workers()), quantile(0.5),
                  quantile(0.99),
                  n.pushes_dropped_late() + n.pushes_dropped_stale() + n.pushes_dropped_norm(),
                  n.pushes_rejected()));
  }
  absl::StrAppend(&out, BuildLines(addresses, now));
  // Failed checkpoints are otherwise only log lines: a shard could run for hours saving nothing.
  for (const v1::StatsResponse& n : now) {
    if (n.checkpoint_failures() == 0) continue;
    const std::string newest =
        n.checkpoint_last_written_version() < 0
            ? std::string("none written since the shard started")
            : absl::StrCat(
                  "the newest written holds version ", n.checkpoint_last_written_version(), " (",
                  absl::FormatTime(
                      "%Y-%m-%d %H:%M:%S UTC",
                      absl::FromUnixSeconds(static_cast<int64_t>(n.checkpoint_last_written_time())),
                      absl::UTCTimeZone()),
                  ")");
    absl::StrAppend(&out, "shard ", n.shard_index(), ": ", n.checkpoint_failures(),
                    " checkpoint(s) FAILED, the last: ", n.checkpoint_last_error(), "; ", newest,
                    "\n");
  }
  // The workers as the first shard serving them sees them (a backup mirrors its primary's
  // membership, not the workers' leases).
  const v1::StatsResponse* serving = nullptr;
  for (const v1::StatsResponse& n : now) {
    if (serving == nullptr && (n.replica_role().empty() || n.replica_role() == "primary")) {
      serving = &n;
    }
  }
  if (serving != nullptr && serving->workers_size() > 0) {
    absl::StrAppend(&out, absl::StrFormat("\n%-7s %-7s %10s %14s %10s\n", "worker", "active",
                                          "clock", "last seen (s)", "pushes"));
    for (const v1::WorkerStats& w : serving->workers()) {
      absl::StrAppend(&out, absl::StrFormat("%-7d %-7s %10d %14.1f %10d\n", w.worker_id(),
                                            w.active() ? "yes" : "no", w.clock(),
                                            w.seconds_since_seen(), w.pushes_applied()));
    }
  }
  return out;
}

}  // namespace ps
