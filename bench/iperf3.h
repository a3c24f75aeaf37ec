// The TCP ceiling the benchmarks compare against: a real iperf3 (Debian's) moving one stream for a
// few seconds. Not thread-safe (it starts processes and writes files in the run directory).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ps {

// Wraps a command's argv, e.g. to run it on another (emulated) host; identity by default.
using ArgvWrapper = std::function<std::vector<std::string>(std::vector<std::string>)>;

// Payload GB/s of one TCP stream from an iperf3 client to a server listening at address:port,
// over `seconds`. NOT_FOUND when iperf3 is not installed, UNAVAILABLE when it does not report.
absl::StatusOr<double> Iperf3GBs(const std::string& run_dir, int seconds,
                                 const std::string& address, int port,
                                 const ArgvWrapper& on_server = nullptr,
                                 const ArgvWrapper& on_client = nullptr);

}  // namespace ps
