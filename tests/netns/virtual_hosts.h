// Hosts on one machine, for multi-host tests and benchmarks: Linux network namespaces, each with
// its own address on a bridge (in a namespace of its own), each link shaped like a wide-area one.
// Needs root and iproute2; shaping latency or loss also needs iptables and netdelay (the kernel
// here has no sch_netem, so latency is emulated through NFQUEUE, see netdelay_main.cc).
//
// Thread-compatible. Owns the namespaces and the netdelay processes: the destructor stops them and
// deletes every namespace it made.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "deploy/subprocess.h"

namespace ps {

// How every host's link behaves. The delay and loss apply to the packets a host receives (so a
// packet from one host to another is delayed once: one way = delay, a round trip = 2 x delay);
// the rate limits what a host sends and what it receives (tbf, 128 KB bursts).
struct LinkShape {
  double rate_gbit = 1;
  double delay_ms = 0;
  double jitter_ms = 0;  // uniform in [-jitter, +jitter], without reordering
  double loss = 0;       // fraction of packets dropped (as the stack hands them over: GSO packets)

  std::string Describe() const;
};

class VirtualHosts {
 public:
  // `count` hosts, 10.77.0.1 .. 10.77.0.<count>, each joined to the bridge by a veth pair (names
  // carry a random tag, so runs at once never meet). `netdelay` is the netdelay program's path
  // (needed when shape.delay_ms > 0); each host's netdelay logs to <log_dir>/netdelay-<i>.log.
  // FAILED_PRECONDITION when this process cannot make namespaces or shape links here at all (a
  // reason to skip, with what is missing); UNAVAILABLE naming the step that failed otherwise.
  static absl::StatusOr<std::unique_ptr<VirtualHosts>> Create(int count, const LinkShape& shape,
                                                              const std::string& netdelay,
                                                              const std::string& log_dir);
  ~VirtualHosts();

  int count() const { return static_cast<int>(interfaces_.size()); }
  std::string Address(int i) const;
  // argv run inside host i.
  std::vector<std::string> On(int i, std::vector<std::string> argv) const;
  // Bytes host i received (sent) on its link; -1 when unknown.
  int64_t ReceivedBytes(int i) const { return LinkBytes(i, "rx"); }
  int64_t SentBytes(int i) const { return LinkBytes(i, "tx"); }

 private:
  // The bytes counter of host i's link in `direction` ("rx", "tx"); -1 when unknown.
  int64_t LinkBytes(int i, const char* direction) const;
  VirtualHosts() = default;
  absl::Status AddNamespace(const std::string& name);
  absl::Status AddHost(int i, const std::string& tag, const LinkShape& shape,
                       const std::string& netdelay, const std::string& log_dir);

  std::string switch_;
  std::vector<std::string> namespaces_;  // the switch first, then the hosts
  std::vector<std::string> interfaces_;  // each host's end of its link
  std::vector<Subprocess> delayers_;     // netdelay in each host, when delayed
};

// Runs a shell command; its output, or UNAVAILABLE with the command and its output.
absl::StatusOr<std::string> Shell(const std::string& command);

}  // namespace ps
