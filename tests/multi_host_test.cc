// A job across hosts, on one machine: Linux network namespaces, one per shard, worker and the
// evaluator, each with its own address on a bridge (in a namespace of its own), each host's link
// limited to 1 Gbit/s by tc tbf and, where the kernel has netem, delayed 2 ms +- 1 ms with 0.1%
// loss. Every daemon starts from one cluster spec with its role. Skips, saying why, where
// namespaces cannot be made (not root, no iproute2).
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <memory>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "deploy/subprocess.h"
#include "nlohmann/json.hpp"
#include "tests/run_dir.h"

namespace ps {
namespace {

// Runs a shell command; its output, or an error with it.
absl::StatusOr<std::string> Shell(const std::string& command) {
  CommandResult r = RunCommand(command);
  if (r.exit_code != 0) return absl::UnavailableError(absl::StrCat(command, ": ", r.output));
  return std::move(r.output);
}

// `count` hosts, 10.77.0.1 .. 10.77.0.<count>, each a network namespace joined to a bridge in a
// switch namespace of its own by a veth pair (so runs at once never meet). Deletes every namespace
// it made when destroyed. Create fails with FAILED_PRECONDITION when this process cannot make
// namespaces at all (a reason to skip), and UNAVAILABLE naming the step that failed after that.
class VirtualHosts {
 public:
  static absl::StatusOr<std::unique_ptr<VirtualHosts>> Create(int count) {
    std::unique_ptr<VirtualHosts> hosts(new VirtualHosts());
    absl::BitGen random;
    const std::string tag = absl::StrCat(absl::Uniform<uint32_t>(random, 0, 1u << 24));
    hosts->switch_ = "pss" + tag;
    if (absl::Status s = hosts->Add("ip netns add " + hosts->switch_, hosts->switch_); !s.ok()) {
      return absl::FailedPreconditionError(s.message());
    }
    absl::Status s =
        Shell(absl::StrCat("ip -n ", hosts->switch_, " link add br0 type bridge")).status();
    if (s.ok()) s = Shell(absl::StrCat("ip -n ", hosts->switch_, " link set br0 up")).status();
    // netem is a kernel module some kernels lack; tbf is the bandwidth limit either way.
    if (s.ok()) {
      hosts->netem_ = Shell(absl::StrCat("ip netns exec ", hosts->switch_,
                                         " tc qdisc add dev lo root netem delay 1ms"))
                          .ok();
    }
    for (int i = 0; s.ok() && i < count; ++i) {
      const std::string ns = absl::StrCat("psh", tag, "-", i);
      // Interface names (15 characters at most) live inside the namespaces, made there.
      const std::string inside = absl::StrCat("h", i), outside = absl::StrCat("s", i);
      s = hosts->Add("ip netns add " + ns, ns);
      const std::string shaping =
          hosts->netem_
              ? absl::StrCat("tc qdisc add dev ", inside,
                             " root handle 1: netem delay 2ms 1ms loss 0.1% && ip netns exec ", ns,
                             " tc qdisc add dev ", inside,
                             " parent 1: handle 2: tbf rate 1gbit burst 256kb latency 50ms")
              : absl::StrCat("tc qdisc add dev ", inside,
                             " root tbf rate 1gbit burst 256kb latency 50ms");
      for (const std::string& c :
           {absl::StrCat("ip -n ", ns, " link add ", inside, " type veth peer name ", outside,
                         " netns ", hosts->switch_),
            absl::StrCat("ip -n ", hosts->switch_, " link set ", outside, " master br0 up"),
            absl::StrCat("ip -n ", ns, " addr add ", hosts->Address(i), "/24 dev ", inside),
            absl::StrCat("ip -n ", ns, " link set ", inside, " up"),
            absl::StrCat("ip -n ", ns, " link set lo up"),
            absl::StrCat("ip netns exec ", ns, " ", shaping)}) {
        if (s.ok()) s = Shell(c).status();
      }
      hosts->interfaces_.push_back(inside);
    }
    if (!s.ok()) return s;
    return hosts;
  }
  ~VirtualHosts() {
    for (const std::string& ns : namespaces_) Shell("ip netns del " + ns).IgnoreError();
  }

  std::string Address(int i) const { return absl::StrCat("10.77.0.", i + 1); }
  bool netem() const { return netem_; }
  // argv run inside host i.
  std::vector<std::string> On(int i, std::vector<std::string> argv) const {
    argv.insert(argv.begin(), {"/usr/bin/env", "ip", "netns", "exec", namespaces_[i + 1]});
    return argv;
  }
  // Bytes host i received on its link.
  int64_t ReceivedBytes(int i) const {
    absl::StatusOr<std::string> out =
        Shell(absl::StrCat("ip -n ", namespaces_[i + 1], " -s -j link show dev ", interfaces_[i]));
    if (!out.ok()) return -1;
    nlohmann::json j = nlohmann::json::parse(*out, nullptr, false);
    if (j.is_discarded() || j.empty()) return -1;
    return j[0]["stats64"]["rx"]["bytes"].get<int64_t>();
  }

 private:
  VirtualHosts() = default;
  absl::Status Add(const std::string& command, const std::string& ns) {
    absl::Status s = Shell(command).status();
    if (s.ok()) namespaces_.push_back(ns);
    return s;
  }

  bool netem_ = false;
  std::string switch_;
  std::vector<std::string> namespaces_;  // the switch first, then the hosts
  std::vector<std::string> interfaces_;  // each host's end of its link
};

// Two shards, two workers and the evaluator on five hosts, from one spec with a token (shards
// listen on their hosts' addresses): the job trains, every update crossed the links, and
// every daemon exits 0 on SIGTERM.
TEST(MultiHostTest, AJobAcrossNamespacesTrainsFromOneSpec) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  if (!Shell("ip -V").ok()) GTEST_SKIP() << "iproute2 is not installed (apt-get install iproute2)";
  absl::StatusOr<std::unique_ptr<VirtualHosts>> made = VirtualHosts::Create(5);
  if (made.status().code() == absl::StatusCode::kFailedPrecondition) {
    GTEST_SKIP() << "cannot make network namespaces here: " << made.status();
  }
  ASSERT_TRUE(made.ok()) << made.status();
  const VirtualHosts& hosts = **made;
  std::cout << "links: 1 Gbit/s (tbf)"
            << (hosts.netem() ? ", 2 ms +- 1 ms, 0.1% loss (netem)"
                              : "; this kernel has no netem: no latency or loss added")
            << "\n";
  const std::string dir = NewRunDir("hosts");
  std::ofstream(dir + "/token") << "multi-host-test-token-0123456789\n";
  const std::string spec = dir + "/cluster.json";
  std::ofstream(spec) << absl::StrCat(R"({"hidden": "128,64", "workers": 2, "shards": [")",
                                      hosts.Address(0), R"(:50051", ")", hosts.Address(1),
                                      R"(:50051"],
      "ps": {"optimizer": "momentum", "lr": 0.01},
      "worker": {"steps": 700, "device": "cpu", "shared_memory": false, "retry_seconds": 120},
      "evaluator": {"interval_seconds": 1, "shared_memory": false, "csv": ")",
                                      dir, R"(/evaluator.csv"},
      "security": {"token_file": ")",
                                      dir, R"(/token"}})");
  auto start = [&](int host, const std::string& program, const std::string& role) {
    absl::StatusOr<Subprocess> p = Subprocess::Start(
        hosts.On(host, {ExecutableDir() + "/" + program, "--cluster=" + spec, "--role=" + role}),
        absl::StrCat(dir, "/", program, "-", host, ".log"));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : Subprocess();
  };
  Subprocess ps0 = start(0, "ps", "ps:0"), ps1 = start(1, "ps", "ps:1");
  Subprocess w0 = start(2, "worker", "worker:0"), w1 = start(3, "worker", "worker:1");
  Subprocess evaluator = start(4, "evaluator", "evaluator");
  for (auto [w, host] : {std::pair{&w0, 2}, std::pair{&w1, 3}}) {
    absl::StatusOr<int> code = w->Wait(absl::Minutes(5));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0) << ReadFile(absl::StrCat(dir, "/worker-", host, ".log"));
  }
  // Each shard received every push of its half of the model over its link: 1,400 x its part.
  const int64_t params = 784 * 128 + 128 + 128 * 64 + 64 + 64 * 10 + 10;
  for (int shard = 0; shard < 2; ++shard) {
    const int64_t received = hosts.ReceivedBytes(shard);
    std::cout << "shard " << shard << " received " << received << " bytes\n";
    EXPECT_GE(received, 1400 * (params / 2) * 4) << "the pushes did not cross the link";
  }
  EXPECT_EQ(evaluator.Stop(absl::Seconds(10)), 0) << ReadFile(dir + "/evaluator-4.log");
  EXPECT_EQ(ps0.Stop(absl::Seconds(10)), 0);
  EXPECT_EQ(ps1.Stop(absl::Seconds(10)), 0);
  const std::string csv = ReadFile(dir + "/evaluator.csv");
  std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  ASSERT_GE(lines.size(), 2u) << csv;
  std::cout << "final: " << lines.back() << "\n";
  EXPECT_EQ(Column(lines.back(), 1), 1400) << "the evaluator scores the final weights";
  EXPECT_GE(Column(lines.back(), 3), 0.75) << lines.back();  // ClusterTest's bar, same job
}

}  // namespace
}  // namespace ps
