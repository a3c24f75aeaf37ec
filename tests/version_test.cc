// The release and the wire version: every program's --version line names project(VERSION)
// (PS_PROJECT_VERSION, passed from CMake), and a client and a shard (or two replicas) of different
// wire versions refuse each other with both versions named, changing nothing.
#include "common/version.h"

#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "deploy/local_cluster.h"
#include "deploy/subprocess.h"
#include "proto/ps.grpc.pb.h"
#include "tests/run_dir.h"

namespace ps {
namespace {

constexpr int kParams = 1000;

// `argv` (argv[0] a program of the build) run to completion: its exit code and output.
std::pair<int, std::string> RunProgram(std::vector<std::string> argv) {
  const std::string log = NewRunDir("version") + "/out.log";
  argv[0] = ExecutableDir() + "/" + argv[0];
  absl::StatusOr<Subprocess> p = Subprocess::Start(argv, log);
  EXPECT_TRUE(p.ok()) << p.status();
  absl::StatusOr<int> code = p.ok() ? p->Wait(absl::Seconds(60)) : p.status();
  EXPECT_TRUE(code.ok()) << code.status();
  return {code.ok() ? *code : -1, ReadFile(log)};
}

TEST(VersionTest, EveryProgramPrintsOneVersionLineOfProjectVersion) {
  const std::string prefix = absl::StrCat("paramserver ", PS_PROJECT_VERSION, " (");
  EXPECT_EQ(VersionLine().rfind(prefix, 0), 0u) << VersionLine();
  for (const char* program :
       {"paramserver", "ps", "worker", "evaluator", "launch", "experiment", "psctl",
        "export_model"}) {
    auto [code, output] = RunProgram({program, "--version"});
    EXPECT_EQ(code, 0) << program << ": " << output;
    EXPECT_EQ(output, VersionLine() + "\n") << program;
  }
}

TEST(VersionTest, VersionComesAfterTheOtherFlagsParsed) {
  auto [good, line] = RunProgram({"ps", "--model=flat:10", "--port=0", "--version"});
  EXPECT_EQ(good, 0) << line;
  EXPECT_EQ(line, VersionLine() + "\n");
  auto [bad, reason] = RunProgram({"ps", "--port=abc", "--version"});
  EXPECT_NE(bad, 0);  // psctl spec's check of a spec's flags relies on it
  EXPECT_NE(reason.find("Illegal value 'abc' specified for flag 'port'"), std::string::npos)
      << reason;
}

// The client's check of a shard's reply (ShardSession::Register, ShardedClient::Stats).
TEST(VersionTest, AClientRefusesAReplyOfAnotherWireVersionNamingBoth) {
  v1::RegisterResponse reply;
  StampRelease(&reply);
  EXPECT_TRUE(CheckRelease(reply, "shard", "client").ok());

  reply.set_wire_version(kWireVersion + 1);
  reply.set_release("9.9.9");
  absl::Status refused = CheckRelease(reply, "shard", "client");
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.message(), absl::StrCat("shard speaks wire version ", kWireVersion + 1,
                                            " (paramserver 9.9.9), this client wire version ",
                                            kWireVersion, " (paramserver ", PS_PROJECT_VERSION,
                                            "): run the same release on both sides"));

  v1::StatsResponse older;  // a shard of a release before wire versions
  refused = CheckRelease(older, "shard", "client");
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("shard sends no wire version (an older paramserver release)"),
            std::string::npos)
      << refused;
}

class WireVersionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.StartShards(1, "flat:1000", 1, {}).ok());
    stub_ = v1::ParameterServer::NewStub(
        grpc::CreateChannel(cluster_.ShardAddress(0), grpc::InsecureChannelCredentials()));
  }

  // Register as worker 0 with wire version `wire` (0: none sent) and release "9.9.9".
  grpc::Status RegisterAs(int wire) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::RegisterRequest request;
    request.set_worker_id(0);
    request.mutable_model()->set_fingerprint("flat:1000");
    request.mutable_model()->set_total_params(kParams);
    request.mutable_model()->set_num_shards(1);
    request.set_wire_version(wire);
    if (wire != 0) request.set_release("9.9.9");
    v1::RegisterResponse response;
    return stub_->Register(&context, request, &response);
  }

  LocalCluster cluster_{ExecutableDir(), NewRunDir("wire")};
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
};

// "client speaks wire version N (paramserver 9.9.9), this shard wire version M (paramserver V)".
std::string Refusal(int wire) {
  return absl::StrCat("client speaks wire version ", wire, " (paramserver 9.9.9), this shard wire ",
                      "version ", kWireVersion, " (paramserver ", PS_PROJECT_VERSION, ")");
}

TEST_F(WireVersionTest, AShardRefusesAClientOfAnotherWireVersionAndChangesNothing) {
  grpc::Status newer = RegisterAs(kWireVersion + 1);
  EXPECT_EQ(newer.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(newer.error_message().find(Refusal(kWireVersion + 1)), std::string::npos)
      << newer.error_message();
  grpc::Status none = RegisterAs(0);
  EXPECT_EQ(none.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(none.error_message().find("client sends no wire version"), std::string::npos)
      << none.error_message();
  EXPECT_EQ(Stats(cluster_.ShardAddress(0)).registered_workers(), 0);

  // A data-plane ticket and the statistics are refused the same way.
  v1::AttachDataPlaneRequest attach;
  attach.set_worker_id(0);
  attach.mutable_model()->set_fingerprint("flat:1000");
  attach.mutable_model()->set_total_params(kParams);
  attach.mutable_model()->set_num_shards(1);
  attach.set_wire_version(kWireVersion + 1);
  attach.set_release("9.9.9");
  v1::StatsRequest stats;
  stats.set_wire_version(kWireVersion + 1);
  stats.set_release("9.9.9");
  for (auto [method, bytes] : std::vector<std::pair<std::string, std::string>>{
           {"AttachDataPlane", attach.SerializeAsString()},
           {"GetStats", stats.SerializeAsString()}}) {
    grpc::Status s =
        RawUnaryCall(cluster_.ShardAddress(0), "/ps.v1.ParameterServer/" + method, bytes);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << method;
    EXPECT_NE(s.error_message().find(Refusal(kWireVersion + 1)), std::string::npos)
        << method << ": " << s.error_message();
  }

  // The same request of this wire version is taken; statistics without one (a probe) answered,
  // naming the shard's build.
  ASSERT_TRUE(RegisterAs(kWireVersion).ok());
  const v1::StatsResponse after = Stats(cluster_.ShardAddress(0));
  EXPECT_EQ(after.registered_workers(), 1);
  EXPECT_EQ(after.wire_version(), kWireVersion);
  EXPECT_EQ(after.release(), PS_PROJECT_VERSION);
  EXPECT_EQ(after.version_line(), VersionLine());
}

TEST(ReplicationVersionTest, APrimaryRefusesABackupOfAnotherWireVersion) {
  LocalCluster cluster(ExecutableDir(), NewRunDir("wire-replicated"));
  StartReplicated(cluster, "flat:1000", {}, 1);
  const int64_t epoch = Stats(cluster.ProcessAddress(0)).replica_epoch();
  auto stub = v1::Replication::NewStub(
      grpc::CreateChannel(cluster.ProcessAddress(0), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  auto stream = stub->Replicate(&context);
  v1::BackupMessage join;
  join.mutable_model()->set_fingerprint("flat:1000");
  join.mutable_model()->set_total_params(kParams);
  join.mutable_model()->set_num_shards(1);
  join.set_epoch(epoch + 5);  // would fence the primary, were the join taken
  join.set_wire_version(kWireVersion + 1);
  join.set_release("9.9.9");
  if (stream->Write(join)) stream->WritesDone();
  v1::ReplicationMessage m;
  while (stream->Read(&m)) {
  }
  grpc::Status refused = stream->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(refused.error_message().find(
                absl::StrCat("backup speaks wire version ", kWireVersion + 1,
                             " (paramserver 9.9.9), this "
                             "primary wire version ",
                             kWireVersion, " (paramserver ", PS_PROJECT_VERSION, ")")),
            std::string::npos)
      << refused.error_message();
  const v1::StatsResponse after = Stats(cluster.ProcessAddress(0));
  EXPECT_EQ(after.replica_role(), "primary");
  EXPECT_EQ(after.replica_epoch(), epoch);
}

}  // namespace
}  // namespace ps
