#include "tests/netns/virtual_hosts.h"

#include <unistd.h>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace ps {

absl::StatusOr<std::string> Shell(const std::string& command) {
  CommandResult r = RunCommand(command);
  if (r.exit_code != 0) return absl::UnavailableError(absl::StrCat(command, ": ", r.output));
  return std::move(r.output);
}

std::string LinkShape::Describe() const {
  std::string s = absl::StrFormat("%g Gbit/s", rate_gbit);
  if (delay_ms > 0) absl::StrAppendFormat(&s, ", %g ms +- %g ms one way", delay_ms, jitter_ms);
  if (loss > 0) absl::StrAppendFormat(&s, ", %g%% loss", loss * 100);
  return s;
}

absl::StatusOr<std::unique_ptr<VirtualHosts>> VirtualHosts::Create(int count,
                                                                   const LinkShape& shape,
                                                                   const std::string& netdelay,
                                                                   const std::string& log_dir) {
  if (geteuid() != 0) return absl::FailedPreconditionError("network namespaces need root");
  if (!Shell("ip -V").ok()) {
    return absl::FailedPreconditionError("iproute2 is not installed (apt-get install iproute2)");
  }
  if ((shape.delay_ms > 0 || shape.loss > 0) && !Shell("iptables --version").ok()) {
    return absl::FailedPreconditionError(
        "latency and loss need iptables (apt-get install iptables)");
  }
  if (shape.delay_ms > 0 && access(netdelay.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("latency needs netdelay, not found at ", netdelay,
                     " (built when libnetfilter-queue-dev is installed)"));
  }
  std::unique_ptr<VirtualHosts> hosts(new VirtualHosts());
  absl::BitGen random;
  const std::string tag = absl::StrCat(absl::Uniform<uint32_t>(random, 0, 1u << 24));
  hosts->switch_ = "pss" + tag;
  if (absl::Status s = hosts->AddNamespace(hosts->switch_); !s.ok()) {
    return absl::FailedPreconditionError(s.message());
  }
  absl::Status s =
      Shell(absl::StrCat("ip -n ", hosts->switch_, " link add br0 type bridge")).status();
  if (s.ok()) s = Shell(absl::StrCat("ip -n ", hosts->switch_, " link set br0 up")).status();
  for (int i = 0; s.ok() && i < count; ++i) s = hosts->AddHost(i, tag, shape, netdelay, log_dir);
  if (!s.ok()) return s;
  return hosts;
}

absl::Status VirtualHosts::AddHost(int i, const std::string& tag, const LinkShape& shape,
                                   const std::string& netdelay, const std::string& log_dir) {
  const std::string ns = absl::StrCat("psh", tag, "-", i);
  if (absl::Status s = AddNamespace(ns); !s.ok()) return s;
  // Interface names (15 characters at most) live inside the namespaces, made there.
  const std::string inside = absl::StrCat("h", i), outside = absl::StrCat("s", i);
  interfaces_.push_back(inside);
  const std::string in_ns = "ip netns exec " + ns + " ";
  std::vector<std::string> commands = {
      absl::StrCat("ip -n ", ns, " link add ", inside, " type veth peer name ", outside, " netns ",
                   switch_),
      absl::StrCat("ip -n ", switch_, " link set ", outside, " master br0 up"),
      absl::StrCat("ip -n ", ns, " addr add ", Address(i), "/24 dev ", inside),
      absl::StrCat("ip -n ", ns, " link set ", inside, " up"),
      absl::StrCat("ip -n ", ns, " link set lo up"),
      // The rate both ways: what the host sends, and (on the switch's end) what it receives.
      absl::StrFormat("%stc qdisc add dev %s root tbf rate %gmbit burst 128kb latency 50ms", in_ns,
                      inside, shape.rate_gbit * 1000),
      absl::StrFormat("ip netns exec %s tc qdisc add dev %s root tbf rate %gmbit burst 128kb "
                      "latency 50ms",
                      switch_, outside, shape.rate_gbit * 1000)};
  // Loss and delay on what the host receives over its link (never on its loopback).
  if (shape.loss > 0) {
    commands.push_back(absl::StrFormat(
        "%siptables -A INPUT -i %s -m statistic --mode random --probability %g -j DROP", in_ns,
        inside, shape.loss));
  }
  if (shape.delay_ms > 0) {
    commands.push_back(absl::StrCat(in_ns, "iptables -A INPUT -i ", inside,
                                    " -j NFQUEUE --queue-num 0 --queue-bypass"));
  }
  for (const std::string& c : commands) {
    if (absl::Status s = Shell(c).status(); !s.ok()) return s;
  }
  if (shape.delay_ms > 0) {
    absl::StatusOr<Subprocess> delayer = Subprocess::Start(
        On(i, {netdelay, absl::StrCat("--delay_ms=", shape.delay_ms),
               absl::StrCat("--jitter_ms=", shape.jitter_ms), absl::StrCat("--seed=", i + 1)}),
        absl::StrCat(log_dir, "/netdelay-", i, ".log"));
    if (!delayer.ok()) return delayer.status();
    delayers_.push_back(*std::move(delayer));
    // Until it has bound the queue, packets would pass undelayed (--queue-bypass).
    for (int tries = 0;; ++tries) {
      absl::StatusOr<std::string> bound = Shell(in_ns + "cat /proc/net/netfilter/nfnetlink_queue");
      if (bound.ok() && !bound->empty()) break;
      if (!delayers_.back().running() || tries == 100) {
        return absl::UnavailableError(absl::StrCat("netdelay did not start in ", ns));
      }
      usleep(50'000);
    }
  }
  return absl::OkStatus();
}

VirtualHosts::~VirtualHosts() {
  for (Subprocess& d : delayers_) d.Stop(absl::Seconds(5));
  for (const std::string& ns : namespaces_) Shell("ip netns del " + ns).IgnoreError();
}

std::string VirtualHosts::Address(int i) const { return absl::StrCat("10.77.0.", i + 1); }

std::vector<std::string> VirtualHosts::On(int i, std::vector<std::string> argv) const {
  argv.insert(argv.begin(), {"/usr/bin/env", "ip", "netns", "exec", namespaces_[i + 1]});
  return argv;
}

int64_t VirtualHosts::LinkBytes(int i, const char* direction) const {
  absl::StatusOr<std::string> out =
      Shell(absl::StrCat("ip -n ", namespaces_[i + 1], " -s -j link show dev ", interfaces_[i]));
  if (!out.ok()) return -1;
  nlohmann::json j = nlohmann::json::parse(*out, nullptr, false);
  if (j.is_discarded() || j.empty()) return -1;
  return j[0]["stats64"][direction]["bytes"].get<int64_t>();
}

absl::Status VirtualHosts::AddNamespace(const std::string& name) {
  absl::Status s = Shell("ip netns add " + name).status();
  if (s.ok()) namespaces_.push_back(name);
  return s;
}

}  // namespace ps
