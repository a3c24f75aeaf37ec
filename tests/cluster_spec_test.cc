// The cluster spec (common/cluster_spec.h): parsing, the flags each role gets, the command line
// that wins over the file, and a job whose five daemons are started from one spec file.
#include "common/cluster_spec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "deploy/local_cluster.h"
#include "deploy/subprocess.h"
#include "tests/run_dir.h"
#include "tests/scoped_env.h"

namespace ps {
namespace {

constexpr char kSpec[] = R"({
  "hidden": [64, 32],
  "shards": ["10.0.0.1:5001", "10.0.0.2:5002/10.0.0.3:5003"],
  "workers": 3,
  "ps": {"consistency": "ssp:2", "lr": 0.05, "staleness_lr": true},
  "worker": {"batch_size": 32},
  "security": {"ca": "ca.pem", "server_cert": "s.pem", "server_key": "s.key",
               "client_cert": "c.pem", "client_key": "c.key",
               "token_file": "token", "read_token_file": "read-token",
               "replication_token_file": "replication-token"}
})";

bool Has(const std::vector<std::string>& flags, const std::string& flag) {
  return std::find(flags.begin(), flags.end(), flag) != flags.end();
}

TEST(ClusterSpecTest, PerWorkerIdentityGivesEachWorkerItsOwnTokenAndNoneTheJobs) {
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(R"({"shards": ["h:1"], "workers": 3,
      "security": {"token_file": "token", "read_token_file": "read-token",
                   "worker_token_file": "tokens/worker-{rank}.token"}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<std::vector<std::string>> ps = FlagsForRole(*spec, "ps", "ps:0");
  ASSERT_TRUE(ps.ok()) << ps.status();
  EXPECT_TRUE(Has(*ps, "--token_file=token"));
  EXPECT_TRUE(Has(*ps, "--worker_identity=true"));
  absl::StatusOr<std::vector<std::string>> worker = FlagsForRole(*spec, "worker", "worker:2");
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_TRUE(Has(*worker, "--token_file=tokens/worker-2.token"));
  EXPECT_FALSE(Has(*worker, "--token_file=token"));
  absl::StatusOr<std::vector<std::string>> evaluator =
      FlagsForRole(*spec, "evaluator", "evaluator");
  ASSERT_TRUE(evaluator.ok()) << evaluator.status();
  EXPECT_TRUE(Has(*evaluator, "--token_file=read-token"));
}

TEST(ClusterSpecTest, EachRoleGetsItsFlags) {
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(kSpec);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<std::vector<std::string>> ps0 = FlagsForRole(*spec, "ps", "ps:0");
  ASSERT_TRUE(ps0.ok()) << ps0.status();
  for (const char* f :
       {"--shard_index=0", "--num_shards=2", "--num_workers=3", "--model=mlp:784-64-32-10",
        "--host=10.0.0.1", "--port=5001", "--consistency=ssp:2", "--lr=0.05", "--staleness_lr=true",
        "--tls_cert=s.pem", "--tls_key=s.key", "--tls_ca=ca.pem", "--token_file=token",
        "--read_token_file=read-token"}) {
    EXPECT_TRUE(Has(*ps0, f)) << f;
  }
  // Only the replicas of a replicated shard get the replication token.
  EXPECT_FALSE(Has(*ps0, "--replication_token_file=replication-token"));
  absl::StatusOr<std::vector<std::string>> backup = FlagsForRole(*spec, "ps", "ps:1/1");
  ASSERT_TRUE(backup.ok()) << backup.status();
  for (const char* f :
       {"--shard_index=1", "--host=10.0.0.3", "--port=5003", "--peer=10.0.0.2:5002", "--replica=1",
        "--replication_token_file=replication-token", "--token_file=token"}) {
    EXPECT_TRUE(Has(*backup, f)) << f;
  }
  absl::StatusOr<std::vector<std::string>> worker = FlagsForRole(*spec, "worker", "worker:2");
  ASSERT_TRUE(worker.ok()) << worker.status();
  for (const char* f : {"--ps=10.0.0.1:5001,10.0.0.2:5002/10.0.0.3:5003", "--rank=2",
                        "--num_workers=3", "--hidden=64,32", "--batch_size=32", "--tls_ca=ca.pem",
                        "--tls_cert=c.pem", "--tls_key=c.key", "--token_file=token"}) {
    EXPECT_TRUE(Has(*worker, f)) << f;
  }
  EXPECT_FALSE(Has(*worker, "--lr=0.05"));  // ps flags stay with the ps
  for (const std::string& flag : *worker) {
    EXPECT_EQ(flag.find("replication"), std::string::npos) << flag;
  }
  absl::StatusOr<std::vector<std::string>> evaluator =
      FlagsForRole(*spec, "evaluator", "evaluator");
  ASSERT_TRUE(evaluator.ok()) << evaluator.status();
  // The evaluator gets the read-only token where there is one.
  EXPECT_TRUE(Has(*evaluator, "--token_file=read-token"));
  absl::StatusOr<std::vector<std::string>> exporter =
      FlagsForRole(*spec, "export_model", "export_model");
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  EXPECT_TRUE(Has(*exporter, "--hidden=64,32"));
  EXPECT_TRUE(Has(*exporter, "--token_file=read-token"));
  EXPECT_FALSE(Has(*exporter, "--batch_size=32"));  // no daemon section of its own
}

// "shards_per_host": each entry's host runs that many shards on consecutive ports, listed host by
// host in turn, replicas alike.
TEST(ClusterSpecTest, ShardsPerHostSpreadsTheShardsOverTheHostsInTurn) {
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(R"({
    "shards": ["10.0.0.1:5001", "10.0.0.2:5002/10.0.0.3:5003"], "shards_per_host": 2,
    "workers": 1})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->shards,
            (std::vector<std::string>{"10.0.0.1:5001", "10.0.0.2:5002/10.0.0.3:5003",
                                      "10.0.0.1:5002", "10.0.0.2:5003/10.0.0.3:5004"}));
  absl::StatusOr<std::vector<std::string>> ps2 = FlagsForRole(*spec, "ps", "ps:2");
  ASSERT_TRUE(ps2.ok()) << ps2.status();
  for (const char* f : {"--shard_index=2", "--num_shards=4", "--host=10.0.0.1", "--port=5002"}) {
    EXPECT_TRUE(Has(*ps2, f)) << f;
  }
  absl::StatusOr<std::vector<std::string>> backup = FlagsForRole(*spec, "ps", "ps:3/1");
  ASSERT_TRUE(backup.ok()) << backup.status();
  for (const char* f :
       {"--shard_index=3", "--host=10.0.0.3", "--port=5004", "--peer=10.0.0.2:5003"}) {
    EXPECT_TRUE(Has(*backup, f)) << f;
  }
  for (const std::string& bad : {std::string("0"), std::string("65"), std::string("\"2\"")}) {
    absl::StatusOr<ClusterSpec> refused = ParseClusterSpec(
        R"({"shards": ["10.0.0.1:5001"], "workers": 1, "shards_per_host": )" + bad + "}");
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(std::string(refused.status().message()).find("\"shards_per_host\" must be"),
              std::string::npos)
        << refused.status();
  }
  for (auto [shards, reason] : std::vector<std::pair<std::string, std::string>>{
           {R"(["10.0.0.1:65535"])",
            "shard entry \"10.0.0.1:65535\": with \"shards_per_host\": 2 "
            "its ports run to 65535 + 1, past 65535"},
           {R"(["10.0.0.1:5001/10.0.0.1:5002"])", "shards 0 and 1 would both be at 10.0.0.1:5002"},
           {R"(["50051"])", "\"shards\""}}) {
    absl::StatusOr<ClusterSpec> refused =
        ParseClusterSpec(R"({"workers": 1, "shards_per_host": 2, "shards": )" + shards + "}");
    ASSERT_FALSE(refused.ok()) << shards;
    EXPECT_NE(std::string(refused.status().message()).find(reason), std::string::npos)
        << refused.status();
  }
}

// "model" names a CNN (a preset here): the shards get its canonical spec, the clients --model.
TEST(ClusterSpecTest, AModelSpecReachesEveryRole) {
  absl::StatusOr<ClusterSpec> spec =
      ParseClusterSpec(R"({"model": "cnn-small", "shards": ["127.0.0.1:5001"], "workers": 2})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string model = "--model=cnn:1x28x28-conv16k5-pool2-conv32k5-pool2-fc128-10";
  EXPECT_TRUE(Has(*FlagsForRole(*spec, "ps", "ps:0"), model));
  const std::vector<std::string> worker = *FlagsForRole(*spec, "worker", "worker:1");
  EXPECT_TRUE(Has(worker, model));
  EXPECT_TRUE(Has(*FlagsForRole(*spec, "evaluator", "evaluator"), model));
  for (const std::string& flag : worker) {
    EXPECT_NE(flag.rfind("--hidden", 0), 0u) << "no --hidden beside --model";
  }
}

// "model" as named tensors, an object or a file beside the spec: every role gets the layout
// inline, so that it reads no file of its own.
TEST(ClusterSpecTest, ATensorLayoutReachesEveryRoleInline) {
  const std::string layout = R"({"tensors": [{"name": "fc.weight", "shape": [10, 784]}]})";
  const std::string canonical = R"(--model={"tensors":[{"name":"fc.weight","shape":[10,784]}]})";
  const std::string dir = NewRunDir("cluster_spec");
  std::ofstream(dir + "/model.json") << layout;
  std::ofstream(dir + "/job.json") << R"({"model": "model.json", "shards": ["127.0.0.1:5001"],
                                          "workers": 2})";
  absl::StatusOr<ClusterSpec> from_file = ReadClusterSpec(dir + "/job.json");
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  absl::StatusOr<ClusterSpec> from_object = ParseClusterSpec(
      R"({"model": )" + layout + R"(, "shards": ["127.0.0.1:5001"], "workers": 2})");
  ASSERT_TRUE(from_object.ok()) << from_object.status();
  // Inline JSON as a string is not a file name to look for beside the spec.
  nlohmann::json as_string = {{"model", layout}, {"shards", {"127.0.0.1:5001"}}, {"workers", 2}};
  std::ofstream(dir + "/inline.json") << as_string.dump();
  absl::StatusOr<ClusterSpec> from_string = ReadClusterSpec(dir + "/inline.json");
  ASSERT_TRUE(from_string.ok()) << from_string.status();
  for (const ClusterSpec& spec : {*from_file, *from_object, *from_string}) {
    EXPECT_TRUE(Has(*FlagsForRole(spec, "ps", "ps:0"), canonical));
    EXPECT_TRUE(Has(*FlagsForRole(spec, "worker", "worker:1"), canonical));
    EXPECT_TRUE(Has(*FlagsForRole(spec, "export_model", "export_model"), canonical));
  }
  absl::StatusOr<ClusterSpec> bad =
      ParseClusterSpec(R"({"model": {"tensors": 3}, "shards": ["127.0.0.1:5001"], "workers": 2})");
  EXPECT_NE(bad.status().message().find("\"model\": bad model layout"), std::string::npos)
      << bad.status();
}

TEST(ClusterSpecTest, EveryRoleIsDescribedOnALineOfItsOwn) {
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(kSpec);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<std::string> roles = DescribeRoles(*spec);
  ASSERT_TRUE(roles.ok()) << roles.status();
  std::vector<std::string> lines = absl::StrSplit(*roles, '\n', absl::SkipEmpty());
  std::vector<std::string> names;
  for (const std::string& line : lines) names.push_back(line.substr(0, line.find(' ')));
  EXPECT_EQ(names, (std::vector<std::string>{"ps:0", "ps:1/0", "ps:1/1", "worker:0", "worker:1",
                                             "worker:2", "evaluator"}));
  EXPECT_NE(lines[2].find("--replica=1"), std::string::npos) << lines[2];
  EXPECT_NE(lines[5].find("--rank=2"), std::string::npos) << lines[5];
}

TEST(ClusterSpecTest, BadSpecsAndRolesAreRefusedWithAReason) {
  struct Case {
    std::string json, reason;
  };
  const std::string shards = R"("shards": ["127.0.0.1:5001"])";
  for (const Case& c : std::vector<Case>{
           {"{", "not valid JSON"},
           {"[]", "top level must be an object"},
           {R"({"workers": 2})", "\"shards\" must be a non-empty array"},
           {R"({"shards": ["127.0.0.1"], "workers": 2})", "\"shards\""},
           {"{" + shards + "}", "\"workers\" must be a positive integer"},
           {"{" + shards + R"(, "workers": 0})", "\"workers\" must be a positive integer"},
           {"{" + shards + R"(, "workers": 2, "wrokers": 3})", "unknown key \"wrokers\""},
           {"{" + shards + R"(, "workers": 2, "hidden": "64,x"})", "\"hidden\""},
           {"{" + shards + R"(, "workers": 2, "ps": {"lr": [1]}})", "ps.lr must be"},
           {"{" + shards + R"(, "workers": 2, "model": "cnn:1x28x28-fc8-pool2-10"})",
            "\"model\": bad model spec"},
           {"{" + shards + R"(, "workers": 2, "model": "cnn-small", "hidden": "8"})", "not both"},
           {"{" + shards + R"(, "workers": 2, "worker": {"model": "cnn-small"}})",
            "worker.model comes from the spec itself"},
           {"{" + shards + R"(, "workers": 2, "security": {"cert": "x"}})",
            "unknown security key \"cert\""},
           {R"({"shards": ["127.0.0.1:1,127.0.0.1:2"], "workers": 2})", "must be one"},
           {R"({"shards": [""], "workers": 2})", "must be one"},
           {"{" + shards + R"(, "workers": 2, "worker": {"rank": 0}})",
            "worker.rank comes from the spec itself"},
           {R"({"shards": ["a:1/b:2"], "workers": 1, "security": {"server_cert": "s.pem",
              "server_key": "s.key", "ca": "ca.pem"}})",
            "replicated shards over TLS need security.client_cert"},
           {R"({"shards": ["a:1/b:2"], "workers": 1, "security": {"token_file": "t"}})",
            "replicated shards with a token or mutual TLS need security.replication_token_file"},
           {"{" + shards + R"(, "workers": 2, "security": {"token_file": "t",
              "worker_token_file": "tokens/worker"}})",
            "security.worker_token_file must contain {rank}"},
           {"{" + shards + R"(, "workers": 2, "security": {"worker_token_file": "w-{rank}"}})",
            "security.worker_token_file needs security.token_file"},
       }) {
    absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(c.json);
    ASSERT_FALSE(spec.ok()) << c.json;
    EXPECT_NE(std::string(spec.status().message()).find(c.reason), std::string::npos)
        << c.json << " -> " << spec.status();
  }
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(kSpec);
  ASSERT_TRUE(spec.ok());
  for (auto [program, role, reason] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"ps", "ps:2", "shards 0..1"},
           {"ps", "ps:1", "replicated: give ps:1/0 or ps:1/1"},
           {"ps", "ps:0/1", "one replica"},
           {"ps", "worker:0", "not one of ps's"},
           {"worker", "worker:3", "workers 0..2"},
           {"worker", "worker", "workers 0..2"},
           {"evaluator", "ps:0", "not one of evaluator's"}}) {
    absl::StatusOr<std::vector<std::string>> flags = FlagsForRole(*spec, program, role);
    ASSERT_FALSE(flags.ok()) << role;
    EXPECT_NE(std::string(flags.status().message()).find(reason), std::string::npos)
        << role << " -> " << flags.status();
  }
}

TEST(ClusterSpecTest, TheCommandLineComesAfterTheSpecAndTheRoleMayComeFromTheEnvironment) {
  const std::string path = NewRunDir("spec") + "/cluster.json";
  std::ofstream(path) << kSpec;
  std::vector<std::string> argv_text = {"worker", "--cluster", path, "--batch_size=8"};
  std::vector<char*> argv;
  for (std::string& a : argv_text) argv.push_back(a.data());
  {
    ScopedEnv role("PS_ROLE", "worker:1");
    absl::StatusOr<ClusterArgs> args = ExpandClusterArgs(4, argv.data(), "worker");
    ASSERT_TRUE(args.ok()) << args.status();
    const std::vector<std::string>& a = args->args;
    EXPECT_EQ(a.front(), "worker");
    EXPECT_EQ(a.back(), "--batch_size=8");  // the command line's own, last: it wins
    auto spec_batch = std::find(a.begin(), a.end(), "--batch_size=32");
    ASSERT_NE(spec_batch, a.end());
    EXPECT_LT(spec_batch - a.begin(), static_cast<int>(a.size()) - 1);
    EXPECT_TRUE(Has(a, "--rank=1"));
    EXPECT_NE(args->summary.find("worker:1 of " + path), std::string::npos) << args->summary;
  }
  {
    ScopedEnv role("PS_ROLE", "");
    absl::StatusOr<ClusterArgs> args = ExpandClusterArgs(4, argv.data(), "worker");
    ASSERT_FALSE(args.ok());
    EXPECT_NE(std::string(args.status().message()).find("$PS_ROLE"), std::string::npos);
  }
  {
    // Tools run inside a worker's pod ignore its $PS_ROLE.
    ScopedEnv role("PS_ROLE", "worker:1");
    absl::StatusOr<ClusterArgs> args = ExpandClusterArgs(4, argv.data(), "psctl");
    ASSERT_TRUE(args.ok()) << args.status();
    EXPECT_NE(args->summary.find("psctl of " + path), std::string::npos) << args->summary;
  }
  // Without --cluster, nothing changes.
  absl::StatusOr<ClusterArgs> plain = ExpandClusterArgs(1, argv.data(), "worker");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->args, std::vector<std::string>{"worker"});
  EXPECT_EQ(plain->summary, "");
  // A spec that is not there.
  std::vector<std::string> missing_text = {"ps", "--cluster=/nonexistent.json", "--role=ps:0"};
  std::vector<char*> missing;
  for (std::string& a : missing_text) missing.push_back(a.data());
  absl::StatusOr<ClusterArgs> none = ExpandClusterArgs(3, missing.data(), "ps");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(std::string(none.status().message()).find("/nonexistent.json"), std::string::npos);
}

TEST(ClusterSpecTest, FilesReadAreRelativeToTheSpecFileAndWorkersFilesToTheirRank) {
  const std::string dir = NewRunDir("spec");
  const std::string path = dir + "/m3/cluster.json";
  std::filesystem::create_directories(dir + "/m3");
  std::ofstream(path) << R"({"shards": ["h:1"], "workers": 2,
      "ps": {"checkpoint_dir": "ckpt", "lr": 0.1},
      "worker": {"csv": "worker-{rank}.csv", "data_dir": "data", "token_file": "worker-token"},
      "security": {"ca": "../certs/ca.pem", "token_file": "/abs/token"}})";
  absl::StatusOr<ClusterSpec> spec = ReadClusterSpec(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<std::vector<std::string>> ps = FlagsForRole(*spec, "ps", "ps:0");
  ASSERT_TRUE(ps.ok());
  EXPECT_TRUE(Has(*ps, "--checkpoint_dir=ckpt"));  // what a daemon writes: its own directory
  EXPECT_TRUE(Has(*ps, "--lr=0.1"));
  absl::StatusOr<std::vector<std::string>> worker = FlagsForRole(*spec, "worker", "worker:1");
  ASSERT_TRUE(worker.ok());
  EXPECT_TRUE(Has(*worker, "--csv=worker-1.csv"));
  EXPECT_TRUE(Has(*worker, "--data_dir=" + dir + "/m3/data"));
  EXPECT_TRUE(Has(*worker, "--token_file=" + dir + "/m3/worker-token"));  // shared: no {rank}
  EXPECT_TRUE(Has(*worker, "--tls_ca=" + dir + "/m3/../certs/ca.pem"));

  // One file for every worker is refused.
  absl::StatusOr<ClusterSpec> shared = ParseClusterSpec(
      R"({"shards": ["h:1"], "workers": 2, "worker": {"csv": "worker.csv"}})");
  ASSERT_FALSE(shared.ok());
  EXPECT_NE(shared.status().message().find("would be one file for all 2 workers"),
            std::string::npos)
      << shared.status();
}

// Two shards, two workers and the evaluator, each started with nothing but the spec and its role
// (one from $PS_ROLE): the job trains, a worker's own --steps overrides the spec's, and psctl
// shows the job from the same file.
TEST(ClusterSpecTest, AJobStartedFromOneSpecFileTrains) {
  const std::string dir = NewRunDir("spec");
  absl::StatusOr<int> port0 = FreePort(), port1 = FreePort();
  ASSERT_TRUE(port0.ok() && port1.ok());
  const std::string spec = dir + "/cluster.json";
  std::ofstream(spec) << absl::StrCat(R"({"hidden": "32", "workers": 2, "shards": ["127.0.0.1:)",
                                      *port0, R"(", "127.0.0.1:)", *port1, R"("],
      "ps": {"optimizer": "momentum", "lr": 0.01}, "worker": {"steps": 300, "device": "cpu"},
      "evaluator": {"interval_seconds": 1}})");
  auto start = [&](const std::string& program, std::vector<std::string> args,
                   const std::string& log) {
    args.insert(args.begin(), {ExecutableDir() + "/" + program, "--cluster=" + spec});
    absl::StatusOr<Subprocess> p = Subprocess::Start(args, dir + "/" + log);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : Subprocess();
  };
  Subprocess ps0 = start("ps", {"--role=ps:0"}, "ps-0.log");
  Subprocess ps1;
  {
    ScopedEnv role("PS_ROLE", "ps:1");  // inherited by the child
    ps1 = start("ps", {}, "ps-1.log");
  }
  Subprocess evaluator = start("evaluator", {"--csv=" + dir + "/evaluator.csv"}, "evaluator.log");
  Subprocess w0 = start("worker", {"--role=worker:0"}, "worker-0.log");
  Subprocess w1 = start("worker", {"--role=worker:1", "--steps=200"}, "worker-1.log");
  for (auto [w, log] : {std::pair{&w0, "worker-0.log"}, std::pair{&w1, "worker-1.log"}}) {
    absl::StatusOr<int> code = w->Wait(absl::Minutes(3));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0) << ReadFile(dir + "/" + log);
  }
  for (int port : {*port0, *port1}) {
    v1::StatsResponse stats = Stats(absl::StrCat("127.0.0.1:", port));
    EXPECT_EQ(stats.pushes_applied(), 500);  // 300 from the spec + 200 from the command line
    EXPECT_EQ(stats.model_fingerprint(), "mlp:784-32-10");
  }
  EXPECT_NE(ReadFile(dir + "/worker-1.log").find("from the cluster spec: worker:1 of " + spec),
            std::string::npos);
  // psctl reads the job from the same file.
  Subprocess psctl = start("psctl", {"status", "--interval=0.2"}, "psctl.log");
  absl::StatusOr<int> psctl_code = psctl.Wait(absl::Seconds(30));
  ASSERT_TRUE(psctl_code.ok()) << psctl_code.status();
  const std::string table = ReadFile(dir + "/psctl.log");
  EXPECT_EQ(*psctl_code, 0) << table;
  for (int port : {*port0, *port1}) {
    EXPECT_NE(table.find(absl::StrCat("127.0.0.1:", port)), std::string::npos) << table;
  }
  EXPECT_NE(table.find(" 500 "), std::string::npos) << table;  // both shards' version
  for (Subprocess* p : {&evaluator, &ps0, &ps1}) EXPECT_EQ(p->Stop(absl::Seconds(10)), 0);
  EXPECT_NE(ReadFile(dir + "/evaluator.csv").find("\n"), std::string::npos);
}

}  // namespace
}  // namespace ps
