#include "common/cluster.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ps {

absl::StatusOr<std::vector<std::string>> ParseShardAddresses(const std::string& list) {
  std::vector<std::string> out;
  for (absl::string_view entry : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    std::vector<std::string> replicas = ShardReplicas(std::string(entry));
    if (replicas.size() > 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad shard entry '", entry, "': at most two replicas (primary/backup)"));
    }
    for (absl::string_view a : replicas) {
      size_t colon = a.rfind(':');
      int port = 0;
      if (colon == absl::string_view::npos || colon == 0 ||
          !absl::SimpleAtoi(a.substr(colon + 1), &port) || port < 1 || port > 65535) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad shard address '", a, "': expected host:port with port 1..65535"));
      }
    }
    out.emplace_back(entry);
  }
  if (out.empty())
    return absl::InvalidArgumentError("no shard addresses given (--ps=host:port,...)");
  return out;
}

std::vector<std::string> ShardReplicas(const std::string& entry) {
  return absl::StrSplit(entry, '/');
}

bool SplitHostPort(const std::string& address, std::string* host, std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return true;
}

}  // namespace ps
