// Issue 49: the shard lets a call in by one admission step (ShardService::Admit), whichever
// transport it came by: a gRPC call with its context's token, a call made on a data-plane
// connection with the credential its ticket recorded at AttachDataPlane. Here real `ps` processes
// on 127.0.0.1 get the same push and the same pull over gRPC and on the data plane from callers
// they must refuse (no token, a wrong token, another worker's identity, a backup that does not
// serve): both transports refuse with the same code, and no weight changes.
#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/sharded_client.h"
#include "deploy/local_cluster.h"
#include "deploy/subprocess.h"
#include "proto/ps.grpc.pb.h"
#include "tests/run_dir.h"
#include "transport/data_connection.h"
#include "transport/security.h"

namespace ps {
namespace {

constexpr int kParams = 1000;
const ModelIdentity kModel{"flat:1000", kParams, 1};
// Tokens of equal length: the wrong one differs from the job's in its last character only.
constexpr char kJobToken[] = "admission-7c1e4b9a2d6f3e80";
constexpr char kWrongToken[] = "admission-7c1e4b9a2d6f3e81";

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// The push every case makes: worker `worker`'s first (sequence 1), a whole-shard float32 gradient
// of ones (under SGD with lr 0.5, applied, it would move every weight by 0.5).
v1::PushHeader PushOf(int worker, int64_t incarnation) {
  v1::PushHeader h;
  h.set_worker_id(worker);
  h.set_incarnation(incarnation);
  h.set_sequence(1);
  h.set_offset(0);
  h.set_length(kParams);
  h.set_dtype(v1::FLOAT32);
  return h;
}
const std::vector<float> kGradient(kParams, 1.0f);

// The pull every case makes: worker `worker`'s, the whole shard as float32.
v1::PullRequest PullOf(int worker) {
  v1::PullRequest r;
  r.set_worker_id(worker);
  r.set_offset(0);
  r.set_length(kParams);
  r.set_dtype(v1::FLOAT32);
  r.mutable_model()->set_fingerprint(kModel.fingerprint);
  r.mutable_model()->set_total_params(kModel.total_params);
  r.mutable_model()->set_num_shards(kModel.num_shards);
  return r;
}

std::unique_ptr<v1::ParameterServer::Stub> Stub(const std::string& address) {
  return v1::ParameterServer::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

void Prepare(grpc::ClientContext* context, const std::string& token) {
  context->set_deadline(absl::ToChronoTime(Soon()));
  if (!token.empty()) context->AddMetadata(kAuthorizationMetadata, BearerValue(token));
}

// `h` pushed over gRPC to `address` with `token` ("": none), kGradient in its stream.
grpc::Status GrpcPush(const std::string& address, const std::string& token,
                      const v1::PushHeader& h) {
  auto stub = Stub(address);
  grpc::ClientContext context;
  Prepare(&context, token);
  v1::PushResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::PushChunk>> writer = stub->Push(&context, &response);
  v1::PushChunk chunk;
  *chunk.mutable_header() = h;
  chunk.set_data(std::string(reinterpret_cast<const char*>(kGradient.data()),
                             kGradient.size() * sizeof(float)));
  writer->Write(chunk);  // false once the shard answered already (refused): Finish says why
  writer->WritesDone();
  return writer->Finish();
}

// `r` pulled over gRPC from `address` with `token` ("": none); its answer is read and dropped.
grpc::Status GrpcPull(const std::string& address, const std::string& token,
                      const v1::PullRequest& r) {
  auto stub = Stub(address);
  grpc::ClientContext context;
  Prepare(&context, token);
  std::unique_ptr<grpc::ClientReader<v1::PullChunk>> reader = stub->Pull(&context, r);
  v1::PullChunk chunk;
  while (reader->Read(&chunk)) {
  }
  return reader->Finish();
}

// A data-plane connection of `worker`'s at `address`, asked for with `token`: `attached` is
// AttachDataPlane's answer, and `connection` is open (its hello welcomed) when that was OK.
struct PlaneAttempt {
  grpc::Status attached;
  std::unique_ptr<DataConnection> connection;
};
PlaneAttempt OpenPlane(const std::string& address, int worker, const std::string& token) {
  PlaneAttempt attempt;
  v1::AttachDataPlaneResponse ticket;
  attempt.attached = RawAttachDataPlane(address, worker, kModel, token, &ticket);
  if (!attempt.attached.ok()) return attempt;
  absl::StatusOr<std::unique_ptr<DataConnection>> c =
      DataConnection::Open({"127.0.0.1", ticket.port(), ticket.connection(), ticket.secret(),
                            ticket.lanes(), ticket.calls()},
                           kParams * sizeof(float), Soon(), absl::Seconds(10));
  EXPECT_TRUE(c.ok()) << c.status();
  if (c.ok()) attempt.connection = *std::move(c);
  return attempt;
}

// The shard's answer to a call made on the plane; a made-up UNKNOWN (and a test failure) where
// the connection itself failed, so that a lost connection never passes for a refusal.
grpc::Status AnswerOf(const absl::StatusOr<DataConnection::Answered>& answered) {
  EXPECT_TRUE(answered.ok()) << answered.status();
  if (!answered.ok()) {
    return grpc::Status(grpc::StatusCode::UNKNOWN,
                        "no answer on the data plane: " + std::string(answered.status().message()));
  }
  return answered->status;
}

// `h` pushed on connection `c` as transfer `transfer` (the same push, its tensor on the plane).
grpc::Status PlanePush(DataConnection& c, v1::PushHeader h, uint64_t transfer) {
  h.mutable_path()->set_data_connection(c.id());
  h.mutable_path()->set_data_transfer(transfer);
  return AnswerOf(
      c.PushCall(transfer, h.SerializeAsString(), kGradient, WireType::kFloat32, Soon()));
}

// `r` pulled on connection `c` as transfer `transfer` into `into`.
grpc::Status PlanePull(DataConnection& c, v1::PullRequest r, uint64_t transfer,
                       std::vector<float>* into) {
  r.mutable_path()->set_data_connection(c.id());
  r.mutable_path()->set_data_transfer(transfer);
  return AnswerOf(c.PullCall(transfer, r.SerializeAsString(), absl::MakeSpan(*into),
                             WireType::kFloat32, Soon()));
}

std::string Describe(const grpc::Status& s) {
  return absl::StrCat(static_cast<int>(s.error_code()), " \"", s.error_message(), "\"");
}

std::vector<float> InitialWeights() {
  std::vector<float> w(kParams);
  for (int i = 0; i < kParams; ++i) w[i] = 0.25f * (i % 100);
  return w;
}

// A client of `addresses` (one shard) as `worker` with `token`, over gRPC only.
std::unique_ptr<ShardedClient> Client(const std::string& addresses, int worker,
                                      const std::string& token) {
  ClientOptions options;
  options.shared_memory = false;
  options.data_plane = false;
  options.security.token = token;
  options.retry_for = absl::Seconds(20);
  return std::make_unique<ShardedClient>(std::vector<std::string>{addresses}, kModel, worker,
                                         options);
}

// `client`'s pull: the initial weights bit for bit, at version 0.
void ExpectInitialWeights(ShardedClient& client) {
  const std::vector<float> initial = InitialWeights();
  std::vector<float> now(kParams, -1.0f);
  absl::StatusOr<ShardedClient::Versions> versions = client.Pull(absl::MakeSpan(now));
  ASSERT_TRUE(versions.ok()) << versions.status();
  EXPECT_EQ(std::memcmp(now.data(), initial.data(), sizeof(float) * kParams), 0);
  EXPECT_EQ(versions->version, std::vector<int64_t>{0});
}

// One shard of kModel (SGD, lr 0.5) for two workers, guarded by the job's token with per-worker
// identity (ps --worker_identity): workers 0 and 1 registered with their own tokens, the weights
// initialised by worker 0.
class AdmissionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteFile(dir_ + "/token", std::string(kJobToken) + "\n");
    ClusterSecurity security;
    security.token_file = dir_ + "/token";
    security.worker_identity = true;
    cluster_ = std::make_unique<LocalCluster>(ExecutableDir(), dir_ + "/run", security);
    ASSERT_TRUE(
        cluster_->StartShards(1, kModel.fingerprint, 2, {"--optimizer=sgd", "--lr=0.5"}).ok());
    address_ = cluster_->ShardAddress(0);
    for (int w : {0, 1}) {
      workers_[w] = Client(address_, w, WorkerToken(kJobToken, w));
      ASSERT_TRUE(workers_[w]->Register().ok());
    }
    absl::StatusOr<int> initialised = workers_[0]->Initialize(InitialWeights());
    ASSERT_TRUE(initialised.ok()) << initialised.status();
    ASSERT_EQ(*initialised, 1);
  }

  // A caller with `token` ("": none) pushes and pulls as worker 0 over gRPC and asks for a
  // data-plane connection: refused UNAUTHENTICATED everywhere, the plane before any connection.
  void ExpectTokenRefusedAlike(const std::string& token) {
    const v1::PushHeader h = PushOf(0, workers_[0]->incarnation(0));
    const v1::PullRequest r = PullOf(0);
    const grpc::Status push = GrpcPush(address_, token, h);
    const grpc::Status pull = GrpcPull(address_, token, r);
    EXPECT_EQ(push.error_code(), grpc::StatusCode::UNAUTHENTICATED) << Describe(push);
    EXPECT_EQ(pull.error_code(), push.error_code()) << Describe(pull);
    PlaneAttempt plane = OpenPlane(address_, 0, token);
    EXPECT_EQ(plane.attached.error_code(), push.error_code()) << Describe(plane.attached);
    EXPECT_EQ(plane.connection, nullptr);
    ExpectInitialWeights(*workers_[0]);
  }

  const std::string dir_ = NewRunDir("admission");
  std::unique_ptr<LocalCluster> cluster_;
  std::string address_;
  std::unique_ptr<ShardedClient> workers_[2];
};

TEST_F(AdmissionTest, NoTokenIsRefusedAlikeOverGrpcAndThePlane) { ExpectTokenRefusedAlike(""); }

TEST_F(AdmissionTest, AWrongTokenIsRefusedAlikeOverGrpcAndThePlane) {
  ExpectTokenRefusedAlike(kWrongToken);
}

// Worker 0's own token, pushing and pulling as worker 1: over gRPC with that token, on the plane
// on worker 0's connection (whose credential is worker 0's), and asking for a connection as
// worker 1.
TEST_F(AdmissionTest, AnotherWorkersIdentityIsRefusedAlikeOverGrpcAndThePlane) {
  const std::string token0 = WorkerToken(kJobToken, 0);
  const v1::PushHeader h = PushOf(1, workers_[1]->incarnation(0));
  const v1::PullRequest r = PullOf(1);
  const grpc::Status push = GrpcPush(address_, token0, h);
  const grpc::Status pull = GrpcPull(address_, token0, r);
  EXPECT_EQ(push.error_code(), grpc::StatusCode::PERMISSION_DENIED) << Describe(push);
  EXPECT_EQ(pull.error_code(), push.error_code()) << Describe(pull);

  PlaneAttempt as_worker1 = OpenPlane(address_, 1, token0);
  EXPECT_EQ(as_worker1.attached.error_code(), push.error_code()) << Describe(as_worker1.attached);

  PlaneAttempt own = OpenPlane(address_, 0, token0);
  ASSERT_TRUE(own.attached.ok()) << Describe(own.attached);
  ASSERT_NE(own.connection, nullptr);
  const grpc::Status plane_push = PlanePush(*own.connection, h, 1);
  std::vector<float> pulled(kParams, -1.0f);
  const grpc::Status plane_pull = PlanePull(*own.connection, r, 2, &pulled);
  EXPECT_EQ(plane_push.error_code(), push.error_code())
      << "gRPC: " << Describe(push) << "; plane: " << Describe(plane_push);
  EXPECT_EQ(plane_pull.error_code(), pull.error_code())
      << "gRPC: " << Describe(pull) << "; plane: " << Describe(plane_pull);
  EXPECT_EQ(pulled, std::vector<float>(kParams, -1.0f)) << "a refused pull wrote values";
  ExpectInitialWeights(*workers_[0]);
}

// A replicated shard's backup serves no call: the same push and pull to it over gRPC and over
// its data plane are refused alike (the plane already at AttachDataPlane, if it gives no ticket),
// and the primary's weights are unchanged.
TEST(AdmissionReplicaTest, ABackupRefusesAlikeOverGrpcAndThePlane) {
  LocalCluster cluster(ExecutableDir(), NewRunDir("admission-replica"));
  // A failover far off: a backup slow to hear its primary on a loaded machine does not take over
  // when a call reaches it (Replica::CheckServing).
  StartReplicated(cluster, kModel.fingerprint,
                  {"--optimizer=sgd", "--lr=0.5", "--failover_seconds=600"});
  if (::testing::Test::HasFatalFailure()) return;
  std::unique_ptr<ShardedClient> worker0 = Client(cluster.ShardAddress(0), 0, "");
  ASSERT_TRUE(worker0->Register().ok());
  absl::StatusOr<int> initialised = worker0->Initialize(InitialWeights());
  ASSERT_TRUE(initialised.ok()) << initialised.status();

  const std::string backup = cluster.ProcessAddress(1);
  const v1::PushHeader h = PushOf(0, worker0->incarnation(0));
  const v1::PullRequest r = PullOf(0);
  const grpc::Status push = GrpcPush(backup, "", h);
  const grpc::Status pull = GrpcPull(backup, "", r);
  EXPECT_EQ(push.error_code(), grpc::StatusCode::UNAVAILABLE) << Describe(push);
  EXPECT_EQ(pull.error_code(), push.error_code()) << Describe(pull);

  PlaneAttempt plane = OpenPlane(backup, 0, "");
  if (plane.attached.ok()) {
    ASSERT_NE(plane.connection, nullptr);
    const grpc::Status plane_push = PlanePush(*plane.connection, h, 1);
    std::vector<float> pulled(kParams, -1.0f);
    const grpc::Status plane_pull = PlanePull(*plane.connection, r, 2, &pulled);
    EXPECT_EQ(plane_push.error_code(), push.error_code())
        << "gRPC: " << Describe(push) << "; plane: " << Describe(plane_push);
    EXPECT_EQ(plane_pull.error_code(), pull.error_code())
        << "gRPC: " << Describe(pull) << "; plane: " << Describe(plane_pull);
    EXPECT_EQ(pulled, std::vector<float>(kParams, -1.0f)) << "a refused pull wrote values";
  } else {
    EXPECT_EQ(plane.attached.error_code(), push.error_code())
        << "gRPC: " << Describe(push) << "; AttachDataPlane: " << Describe(plane.attached);
  }
  EXPECT_TRUE(WaitForRole(backup, "backup", absl::Seconds(1))) << "the backup took over";
  ExpectInitialWeights(*worker0);
}

}  // namespace
}  // namespace ps
