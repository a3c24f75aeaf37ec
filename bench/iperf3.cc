#include "bench/iperf3.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "deploy/subprocess.h"
#include "nlohmann/json.hpp"

namespace ps {

absl::StatusOr<double> Iperf3GBs(const std::string& run_dir, int seconds,
                                 const std::string& address, int port, const ArgvWrapper& on_server,
                                 const ArgvWrapper& on_client) {
  const std::string iperf3 = "/usr/bin/iperf3";
  if (access(iperf3.c_str(), X_OK) != 0) {
    return absl::NotFoundError("iperf3 is not installed (apt-get install iperf3)");
  }
  auto wrap = [](const ArgvWrapper& w, std::vector<std::string> argv) {
    return w ? w(std::move(argv)) : argv;
  };
  absl::StatusOr<Subprocess> server = Subprocess::Start(
      wrap(on_server, {iperf3, "-s", "-1", "-B", address, "-p", absl::StrCat(port)}),
      run_dir + "/iperf3-server.log");
  if (!server.ok()) return server.status();
  const std::string report = run_dir + "/iperf3.json";
  for (int attempt = 0; attempt < 10; ++attempt) {
    absl::SleepFor(absl::Milliseconds(200));  // until the server listens
    std::remove(report.c_str());
    absl::StatusOr<Subprocess> client = Subprocess::Start(
        wrap(on_client,
             {iperf3, "-c", address, "-p", absl::StrCat(port), "-t", absl::StrCat(seconds), "-J"}),
        report);
    if (!client.ok()) return client.status();
    absl::StatusOr<int> code = client->Wait(absl::Seconds(seconds + 30));
    if (!code.ok() || *code != 0) continue;
    std::ifstream in(report);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("end") || !j["end"].contains("sum_received")) continue;
    server->WaitOrKill(absl::Seconds(2));
    return j["end"]["sum_received"].value("bits_per_second", 0.0) / 8 / 1e9;
  }
  server->WaitOrKill(absl::Seconds(1));
  return absl::UnavailableError("iperf3 did not report");
}

}  // namespace ps
