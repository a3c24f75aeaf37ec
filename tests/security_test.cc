// Who gets in: real ps processes on 127.0.0.1 (ports chosen at run time) guarded by tokens and TLS,
// with certificates made at run time by deploy/make_test_certs.sh in a temporary directory. Every
// refused call must leave the weights bit-identical.
#include "transport/security.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/version.h"
#include "transport/shared_memory.h"
#include "deploy/local_cluster.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "proto/ps.grpc.pb.h"
#include "tests/run_dir.h"
#include "tests/scoped_env.h"
#include "proto/ps.pb.h"
#include "client/sharded_client.h"

namespace ps {
namespace {

std::string NewRunDir() { return ps::NewRunDir("security"); }

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// Tokens of equal length: a wrong token differs from the real one in its last character only.
constexpr char kWriteToken[] = "write-4f9c2a7e1b3d5f60";
constexpr char kReadToken[] = "read-8e1d7c3b5a9f2e40x";
constexpr char kWrongToken[] = "write-4f9c2a7e1b3d5f61";
constexpr char kReplicationToken[] = "replicate-5d2b8f1c7a3e";

// Certificates (deploy/make_test_certs.sh) and token files in a fresh temporary directory.
struct Secrets {
  std::string dir = NewRunDir();
  std::string File(const std::string& name) const { return dir + "/" + name; }

  // Makes the certificates; false (with the script's output logged) if the script failed.
  bool MakeCertificates() const { return MakeTestCertificates(dir + "/certs"); }
  std::string Cert(const std::string& name) const { return dir + "/certs/" + name; }

  ClusterSecurity Tokens() const {
    WriteFile(File("token"), std::string(kWriteToken) + "\n");
    WriteFile(File("read-token"), std::string(kReadToken) + "\n");
    ClusterSecurity s;
    s.token_file = File("token");
    s.read_token_file = File("read-token");
    return s;
  }
  ClusterSecurity MutualTlsAndTokens() const {
    ClusterSecurity s = Tokens();
    s.ca = Cert("ca.pem");
    s.server_cert = Cert("server.pem");
    s.server_key = Cert("server.key");
    s.client_cert = Cert("client.pem");
    s.client_key = Cert("client.key");
    return s;
  }
};

// A client's TLS settings: a CA to check the ps with and an optional client certificate.
ClientSecurity Tls(const std::string& ca, const std::string& cert, const std::string& key,
                   const std::string& token) {
  absl::StatusOr<ClientSecurity> s = LoadClientSecurity({cert, key, ca}, "");
  EXPECT_TRUE(s.ok()) << s.status();
  ClientSecurity out = s.ok() ? *s : ClientSecurity{};
  out.token = token;
  return out;
}

ClientSecurity Plaintext(const std::string& token) {
  ClientSecurity s;
  s.token = token;
  return s;
}

constexpr int kParams = 1000;
constexpr int64_t kHugeSequence = int64_t{1} << 62;

// A cluster of `shards` shards holding a kParams "model" initialised to 0.5 * i by worker 0, which
// holds the write token (and a client certificate where TLS is on).
class GuardedShards {
 public:
  GuardedShards(int shards, const ClusterSecurity& security, ClientSecurity owner)
      : cluster_(ExecutableDir(), NewRunDir(), security),
        model_{"flat:1000", kParams, shards},
        owner_security_(std::move(owner)) {
    absl::Status started =
        cluster_.StartShards(shards, model_.fingerprint, 2, {"--optimizer=sgd", "--lr=0.5"});
    EXPECT_TRUE(started.ok()) << started << "\n" << ReadFile(cluster_.run_dir() + "/ps-0.log");
    if (!started.ok()) return;
    owner_ = Client(0, owner_security_);
    absl::StatusOr<int64_t> registered = owner_->Register();
    EXPECT_TRUE(registered.ok()) << registered.status();
    for (int i = 0; i < kParams; ++i) initial_[i] = 0.5f * i;
    absl::StatusOr<int> initialised = owner_->Initialize(initial_);
    EXPECT_TRUE(initialised.ok() && *initialised == shards) << initialised.status();
  }

  bool ok() const { return owner_ != nullptr; }

  // A client of every shard. Calls expected to fail the TLS handshake pass `retry_for` 0, so that
  // UNAVAILABLE is reported at once instead of retried.
  std::unique_ptr<ShardedClient> Client(int worker_id, ClientSecurity security,
                                        absl::Duration retry_for = absl::Seconds(30)) {
    std::vector<std::string> addresses;
    for (int s = 0; s < model_.num_shards; ++s) addresses.push_back(cluster_.ShardAddress(s));
    ClientOptions options;
    options.retry_for = retry_for;
    options.security = std::move(security);
    return std::make_unique<ShardedClient>(addresses, model_, worker_id, options);
  }

  // Pulls with the owner's credentials as an observer: the values must be the initial ones, bit
  // for bit, at version `version` on every shard.
  void ExpectWeights(int64_t version = 0) {
    std::unique_ptr<ShardedClient> reader = Client(-1, owner_security_);
    std::vector<float> now(kParams);
    absl::StatusOr<ShardedClient::Versions> versions = reader->Pull(absl::MakeSpan(now));
    ASSERT_TRUE(versions.ok()) << versions.status();
    EXPECT_EQ(std::memcmp(now.data(), initial_.data(), sizeof(float) * kParams), 0);
    EXPECT_EQ(versions->version, std::vector<int64_t>(model_.num_shards, version));
  }

  // Every call that needs the write token (a Pull as a worker too: it refreshes the lease), from
  // `client`: each must fail with `code` and change nothing.
  void ExpectEveryWriteRefused(ShardedClient& client, absl::StatusCode code,
                               const std::string& who) {
    std::vector<float> fifty(kParams, 50.0f), values(kParams);
    std::vector<std::pair<std::string, absl::Status>> calls = {
        {"Register", client.Register().status()},
        {"Initialize", client.Initialize(fifty).status()},
        {"Push", client.Push(fifty, 0).status()},
        {"Push with sequence 2^62", client.Push(fifty, kHugeSequence).status()},
        {"Heartbeat", client.Heartbeat(absl::Seconds(10))},
        {"Leave", client.Leave(absl::Seconds(10))},
        {"Pull", client.Pull(absl::MakeSpan(values)).status()},
    };
    for (const auto& [call, status] : calls) {
      EXPECT_EQ(status.code(), code) << who << ", " << call << ": " << status;
    }
    ExpectWeights();
  }

  // The owner's first push (sequence 0, a zero gradient: under SGD the weights stay
  // bit-identical) applies once on every shard, and the owner is the only worker registered.
  void ExpectTheOwnersFirstPushApplied() {
    std::vector<float> zero(kParams, 0.0f);
    absl::StatusOr<ShardedClient::PushSummary> push = owner_->Push(zero, 0);
    ASSERT_TRUE(push.ok()) << push.status();
    EXPECT_EQ(push->duplicates, 0);
    ExpectWeights(/*version=*/1);
    absl::StatusOr<std::vector<v1::StatsResponse>> all = owner_->Stats();
    ASSERT_TRUE(all.ok()) << all.status();
    for (const v1::StatsResponse& s : *all) {
      EXPECT_EQ(s.registered_workers(), 1);
      EXPECT_EQ(s.pushes_applied(), 1);
    }
  }

  ShardedClient& owner() { return *owner_; }
  LocalCluster& cluster() { return cluster_; }

 private:
  LocalCluster cluster_;
  ModelIdentity model_;
  ClientSecurity owner_security_;
  std::unique_ptr<ShardedClient> owner_;
  std::vector<float> initial_ = std::vector<float>(kParams);
};

// A raw AttachSharedMemory as `worker` with `token` ("": none), from this host.
grpc::Status AttachSharedMemory(const std::string& address, int worker, const std::string& token) {
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) context.AddMetadata(kAuthorizationMetadata, BearerValue(token));
  v1::AttachSharedMemoryRequest request;
  request.set_worker_id(worker);
  request.mutable_model()->set_fingerprint("flat:1000");
  request.mutable_model()->set_total_params(kParams);
  request.mutable_model()->set_num_shards(2);
  request.set_process_space(ProcessSpaceId());
  v1::AttachSharedMemoryResponse response;
  return stub->AttachSharedMemory(&context, request, &response);
}

// A raw Checkpoint with `token` ("": none).
grpc::Status CheckpointNow(const std::string& address, const std::string& token) {
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) context.AddMetadata(kAuthorizationMetadata, BearerValue(token));
  v1::CheckpointResponse response;
  return stub->Checkpoint(&context, v1::CheckpointRequest(), &response);
}

// --- Tokens, plaintext on loopback ---

class TokenTest : public ::testing::Test {
 protected:
  Secrets secrets_;
  GuardedShards shards_{2, secrets_.Tokens(), Plaintext(kWriteToken)};
  void SetUp() override { ASSERT_TRUE(shards_.ok()); }
};

TEST_F(TokenTest, CallersWithoutTheTokenAreUnauthenticatedAndChangeNothing) {
  // The audit's stranger (worker 666 pushing 50.0) and its forged worker 0 (sequence 2^62), with
  // no token, a wrong one, a prefix of the real one and the real one with a byte more.
  for (const std::string& token :
       {std::string(), std::string(kWrongToken), std::string(kWriteToken).substr(0, 10),
        std::string(kWriteToken) + "0"}) {
    for (int id : {666, 0}) {
      std::unique_ptr<ShardedClient> stranger = shards_.Client(id, Plaintext(token));
      shards_.ExpectEveryWriteRefused(*stranger, absl::StatusCode::kUnauthenticated,
                                      absl::StrCat("worker ", id, " with token '", token, "'"));
      EXPECT_EQ(stranger->Stats().status().code(), absl::StatusCode::kUnauthenticated);
    }
  }
  // The token without "Bearer ", straight through a raw stub.
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(shards_.cluster().ShardAddress(0), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  context.AddMetadata(kAuthorizationMetadata, kWriteToken);
  v1::StatsResponse stats;
  grpc::Status raw = stub->GetStats(&context, v1::StatsRequest(), &stats);
  EXPECT_EQ(raw.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(raw.error_message().find("expected 'Bearer <token>'"), std::string::npos)
      << raw.error_message();
  // Shared memory is handed out to token holders only.
  EXPECT_EQ(AttachSharedMemory(shards_.cluster().ShardAddress(0), 0, "").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(CheckpointNow(shards_.cluster().ShardAddress(0), "").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // Worker 0's own pushes still apply: the forged sequence 2^62 was never recorded; worker 666
  // never joined.
  shards_.ExpectTheOwnersFirstPushApplied();
}

TEST_F(TokenTest, TheReadOnlyTokenReadsButNeverWrites) {
  std::unique_ptr<ShardedClient> observer = shards_.Client(-1, Plaintext(kReadToken));
  ASSERT_TRUE(observer->Register().ok());
  std::vector<float> values(kParams);
  ASSERT_TRUE(observer->Pull(absl::MakeSpan(values)).ok());
  EXPECT_EQ(values[999], 0.5f * 999);
  ASSERT_TRUE(observer->Stats().ok());

  for (int id : {0, 1}) {  // a registered worker's id and a fresh one
    std::unique_ptr<ShardedClient> reader = shards_.Client(id, Plaintext(kReadToken));
    shards_.ExpectEveryWriteRefused(*reader, absl::StatusCode::kPermissionDenied,
                                    absl::StrCat("read-only token as worker ", id));
  }
  // An observer may read through shared memory; a worker id needs the write token.
  const std::string shard0 = shards_.cluster().ShardAddress(0);
  EXPECT_TRUE(AttachSharedMemory(shard0, -1, kReadToken).ok());
  EXPECT_EQ(AttachSharedMemory(shard0, 0, kReadToken).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(CheckpointNow(shard0, kReadToken).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // With the write token: these shards keep no checkpoints, and say so.
  EXPECT_EQ(CheckpointNow(shard0, kWriteToken).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  absl::Status push = shards_.Client(0, Plaintext(kReadToken))->Push(values, 0).status();
  EXPECT_NE(push.message().find("Push needs the write token"), std::string::npos) << push;
  EXPECT_EQ((*shards_.owner().Stats())[0].registered_workers(), 1);
}

TEST_F(TokenTest, TheHealthServiceStaysOpen) {
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(shards_.cluster().ShardAddress(0), grpc::InsecureChannelCredentials()));
  // No token needed; the shard (initialised) reports SERVING once its daemon has noticed.
  auto status = [&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::health::v1::HealthCheckResponse response;
    EXPECT_TRUE(health->Check(&context, grpc::health::v1::HealthCheckRequest(), &response).ok());
    return response.status();
  };
  absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (status() != grpc::health::v1::HealthCheckResponse::SERVING && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST(TokenFromTheEnvironmentTest, PsTokenGuardsTheShardsAndClientsSendIt) {
  setenv("PS_TOKEN", kWriteToken, 1);  // inherited by the shard started below
  absl::StatusOr<ClientSecurity> owner = LoadClientSecurity({}, "");
  GuardedShards shards(1, ClusterSecurity{}, owner.ok() ? *owner : ClientSecurity{});
  unsetenv("PS_TOKEN");
  ASSERT_TRUE(owner.ok()) << owner.status();
  EXPECT_EQ(owner->token, kWriteToken);
  ASSERT_TRUE(shards.ok());
  shards.ExpectWeights();
  std::unique_ptr<ShardedClient> stranger = shards.Client(0, Plaintext(""));
  EXPECT_EQ(stranger->Register().status().code(), absl::StatusCode::kUnauthenticated);
}

// --- TLS ---

class MutualTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(secrets_.MakeCertificates());
    owner_ = Tls(secrets_.Cert("ca.pem"), secrets_.Cert("client.pem"), secrets_.Cert("client.key"),
                 kWriteToken);
    shards_ = std::make_unique<GuardedShards>(1, secrets_.MutualTlsAndTokens(), owner_);
    ASSERT_TRUE(shards_->ok());
  }

  Secrets secrets_;
  ClientSecurity owner_;
  std::unique_ptr<GuardedShards> shards_;
};

TEST_F(MutualTlsTest, ClientsWithoutATrustedCertificateCannotConnectAndAreToldWhy) {
  // Before: gRPC said only "failed to connect to all addresses ... Socket closed" (UNAVAILABLE),
  // the same for each mistake, and clients retried it for their whole budget (60 s).
  const std::string ca = secrets_.Cert("ca.pem");
  struct Case {
    std::string who;
    ClientSecurity security;
    std::string cause;
  };
  std::vector<Case> cases = {
      {"plaintext", Plaintext(kWriteToken),
       "the shard serves TLS and this client connects in plaintext: give --tls_ca"},
      {"TLS without a client certificate", Tls(ca, "", "", kWriteToken),
       "it requires a client certificate (mutual TLS), and this client gave none"},
      {"a client certificate from another CA",
       Tls(ca, secrets_.Cert("other-client.pem"), secrets_.Cert("other-client.key"), kWriteToken),
       "it refused this client's certificate (--tls_cert=" + secrets_.Cert("other-client.pem")},
      {"a client that does not trust the ps's CA",
       Tls(secrets_.Cert("other-ca.pem"), secrets_.Cert("client.pem"), secrets_.Cert("client.key"),
           kWriteToken),
       "the shard's certificate is not trusted by --tls_ca=" + secrets_.Cert("other-ca.pem")},
  };
  // The handshake fails before any call reaches the service; the client's own probe names the
  // cause, and the call fails at once (FAILED_PRECONDITION: no retry heals it).
  for (Case& c : cases) {
    std::unique_ptr<ShardedClient> client = shards_->Client(0, std::move(c.security));
    const absl::Time start = absl::Now();
    shards_->ExpectEveryWriteRefused(*client, absl::StatusCode::kFailedPrecondition, c.who);
    absl::Status stats = client->Stats().status();
    EXPECT_EQ(stats.code(), absl::StatusCode::kFailedPrecondition) << c.who;
    EXPECT_NE(stats.message().find(c.cause), std::string::npos) << c.who << ": " << stats;
    EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << c.who << " (8 calls)";
  }
}

TEST_F(MutualTlsTest, ATrustedCertificateStillNeedsTheToken) {
  const std::string ca = secrets_.Cert("ca.pem"), cert = secrets_.Cert("client.pem"),
                    key = secrets_.Cert("client.key");
  std::unique_ptr<ShardedClient> no_token = shards_->Client(0, Tls(ca, cert, key, ""));
  shards_->ExpectEveryWriteRefused(*no_token, absl::StatusCode::kUnauthenticated,
                                   "certificate, no token");
  std::unique_ptr<ShardedClient> reader = shards_->Client(0, Tls(ca, cert, key, kReadToken));
  shards_->ExpectEveryWriteRefused(*reader, absl::StatusCode::kPermissionDenied,
                                   "certificate, read-only token");
  std::unique_ptr<ShardedClient> observer = shards_->Client(-1, Tls(ca, cert, key, kReadToken));
  EXPECT_TRUE(observer->Register().ok());
  EXPECT_TRUE(observer->Stats().ok());
}

TEST(ServerOnlyTlsTest, ClientsNeedNoCertificateButMustUseTls) {
  Secrets secrets;
  ASSERT_TRUE(secrets.MakeCertificates());
  ClusterSecurity security = secrets.Tokens();
  security.ca = secrets.Cert("ca.pem");
  security.server_cert = secrets.Cert("server.pem");
  security.server_key = secrets.Cert("server.key");
  ClientSecurity owner = Tls(security.ca, "", "", kWriteToken);
  GuardedShards shards(1, security, owner);
  ASSERT_TRUE(shards.ok());
  shards.ExpectWeights();
  std::unique_ptr<ShardedClient> plaintext = shards.Client(0, Plaintext(kWriteToken));
  shards.ExpectEveryWriteRefused(*plaintext, absl::StatusCode::kFailedPrecondition, "plaintext");
}

// --- A whole cluster ---

TEST(SecureClusterTest, WorkersAndAReadOnlyEvaluatorTrainOverMutualTlsWithTokens) {
  Secrets secrets;
  ASSERT_TRUE(secrets.MakeCertificates());
  ClusterSecurity security = secrets.MutualTlsAndTokens();
  LocalCluster cluster(ExecutableDir(), NewRunDir(), security);
  ASSERT_TRUE(
      cluster.StartShards(2, "mlp:784-32-10", 2, {"--optimizer=momentum", "--lr=0.01"}).ok());
  EXPECT_NE(
      ReadFile(cluster.run_dir() + "/ps-0.log").find("mutual TLS, write and read-only tokens"),
      std::string::npos);
  // The evaluator gets the read-only token (LocalCluster gives it the read token file).
  ASSERT_TRUE(cluster.StartEvaluator({"--hidden=32", "--interval_seconds=1"}).ok());
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(cluster.StartWorker(r, 2, {"--hidden=32", "--steps=150"}).ok());
  }
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<int> code = cluster.worker(r)->Wait(absl::Minutes(4));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0) << ReadFile(cluster.run_dir() + "/worker-" + std::to_string(r) + ".log");
  }
  ClientSecurity observer = Tls(security.ca, security.client_cert, security.client_key, kReadToken);
  ClientOptions options;
  options.security = observer;
  ShardedClient stats_client({cluster.ShardAddress(0), cluster.ShardAddress(1)}, {"unused", 1, 2},
                             -1, options);
  absl::StatusOr<std::vector<v1::StatsResponse>> stats = stats_client.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  for (const v1::StatsResponse& s : *stats) {
    EXPECT_EQ(s.version(), 300);
    EXPECT_EQ(s.pushes_applied(), 300);
    EXPECT_EQ(s.pushes_rejected(), 0);
    EXPECT_EQ(s.registered_workers(), 2);
  }
  // What launch --kill=...@Nu reads, through the cluster's TLS and read-only token.
  EXPECT_EQ(cluster.UpdatesApplied(absl::Seconds(10)), 600);
  EXPECT_EQ(cluster.Stop(), "");
  // The read-only evaluator pulled and scored the final weights at shutdown.
  std::string last = LastLine(cluster.run_dir() + "/evaluator.csv");
  EXPECT_EQ(last.substr(last.find(',') + 1, 4), "300,") << last;
}

// --- Replication: only the replica peer, by its own credential ---

const char kMlp[] = "mlp:784-32-10";
constexpr int64_t kMlpParams = 784 * 32 + 32 + 32 * 10 + 10;

// Polls GetStats of shard process `process` (with the cluster's credentials) until `done` holds.
bool WaitForStats(LocalCluster& cluster, int process,
                  const std::function<bool(const v1::StatsResponse&)>& done,
                  absl::Duration timeout = absl::Minutes(2)) {
  for (absl::Time deadline = absl::Now() + timeout; absl::Now() < deadline;) {
    absl::StatusOr<v1::StatsResponse> s = cluster.ProcessStats(process, absl::Seconds(5));
    if (s.ok() && done(*s)) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// What a worker holding the write token could send: a join claiming epoch 99, which fenced a
// primary (and a backup) before replication needed its own credential.
grpc::Status ClaimEpoch99(const std::string& address, const std::string& token) {
  auto stub =
      v1::Replication::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) context.AddMetadata(kAuthorizationMetadata, BearerValue(token));
  auto stream = stub->Replicate(&context);
  v1::BackupMessage join;
  join.mutable_model()->set_fingerprint(kMlp);
  join.mutable_model()->set_total_params(kMlpParams);
  join.mutable_model()->set_num_shards(1);
  join.set_shard_index(0);
  join.set_epoch(99);
  StampRelease(&join);
  if (stream->Write(join)) stream->WritesDone();
  v1::ReplicationMessage m;
  while (stream->Read(&m)) {
  }
  return stream->Finish();
}

// Replication/Status with take_over, as the same worker.
grpc::Status AskToTakeOver(const std::string& address, const std::string& token) {
  auto stub =
      v1::Replication::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) context.AddMetadata(kAuthorizationMetadata, BearerValue(token));
  v1::ReplicaStatusRequest request;
  request.set_take_over(true);
  v1::ReplicaStatusResponse response;
  return stub->Status(&context, request, &response);
}

// The tester's attack: a worker's write token sends Replicate{epoch 99} to the primary and then to
// the backup (and asks each to take over). Both refuse it with PERMISSION_DENIED; neither is
// fenced, exits, or changes role or epoch; the worker trains on and every step is applied exactly
// once, on both replicas, which keep replicating with the credential LocalCluster gave them.
TEST(ReplicationCredentialTest, TheWriteTokenCannotFenceOrStopEitherReplica) {
  Secrets secrets;
  LocalCluster cluster(ExecutableDir(), NewRunDir(), secrets.Tokens());
  ASSERT_TRUE(cluster.StartShards(1, kMlp, 1, {}, /*replicas=*/2).ok());
  EXPECT_NE(ReadFile(cluster.run_dir() + "/ps-0-0.log").find("replication token"),
            std::string::npos);
  // At most 200 steps/s: still training for >= 1.5 s after the attack however fast the machine.
  constexpr int kSteps = 400;
  ASSERT_TRUE(
      cluster
          .StartWorker(
              0, 1, {"--hidden=32", absl::StrCat("--steps=", kSteps), "--push_delay=fixed:0.005"})
          .ok());
  auto role_is = [](const std::string& role) {
    return [role](const v1::StatsResponse& s) { return s.replica_role() == role; };
  };
  ASSERT_TRUE(WaitForStats(cluster, 1, role_is("backup")));
  ASSERT_TRUE(WaitForStats(cluster, 0, [](const v1::StatsResponse& s) {
    return s.replica_role() == "primary" && s.version() >= 50;
  }));

  for (int process : {0, 1}) {
    const std::string address = cluster.ProcessAddress(process);
    for (const char* token : {kWriteToken, kReadToken}) {
      grpc::Status claim = ClaimEpoch99(address, token);
      EXPECT_EQ(claim.error_code(), grpc::StatusCode::PERMISSION_DENIED)
          << "process " << process << ": " << claim.error_message();
      EXPECT_NE(claim.error_message().find("needs the replication credential"), std::string::npos)
          << claim.error_message();
      EXPECT_EQ(AskToTakeOver(address, token).error_code(), grpc::StatusCode::PERMISSION_DENIED);
    }
    for (const std::string& token : {std::string(), std::string(kWrongToken)}) {
      EXPECT_EQ(ClaimEpoch99(address, token).error_code(), grpc::StatusCode::UNAUTHENTICATED);
      EXPECT_EQ(AskToTakeOver(address, token).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    }
  }
  // Training goes on through the same primary, which acknowledges only what its backup applied.
  absl::StatusOr<v1::StatsResponse> attacked = cluster.ProcessStats(0, absl::Seconds(10));
  ASSERT_TRUE(attacked.ok()) << attacked.status();
  ASSERT_TRUE(WaitForStats(cluster, 0, [&](const v1::StatsResponse& s) {
    return s.version() >= attacked->version() + 50;
  }));
  for (int process : {0, 1}) {
    EXPECT_TRUE(cluster.shards()[process].running()) << cluster.ProcessName(process);
    absl::StatusOr<v1::StatsResponse> s = cluster.ProcessStats(process, absl::Seconds(10));
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->replica_role(), process == 0 ? "primary" : "backup");
    EXPECT_EQ(s->replica_epoch(), 1);
  }

  absl::StatusOr<int> code = cluster.worker(0)->Wait(absl::Minutes(3));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << ReadFile(cluster.run_dir() + "/worker-0.log");
  for (int process : {0, 1}) {
    // The backup applies the last change just after the primary acknowledged it.
    EXPECT_TRUE(WaitForStats(cluster, process, [](const v1::StatsResponse& s) {
      return s.version() == kSteps;
    })) << cluster.ProcessName(process);
    absl::StatusOr<v1::StatsResponse> s = cluster.ProcessStats(process, absl::Seconds(10));
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->version(), kSteps);
    EXPECT_EQ(s->replica_epoch(), 1);
    EXPECT_EQ(ReadFile(absl::StrCat(cluster.run_dir(), "/", cluster.ProcessName(process), ".log"))
                  .find("fenced"),
              std::string::npos);
  }
  EXPECT_EQ(cluster.Stop(), "");
}

// With tokens on, the real peer still replicates and fails over: the primary is killed mid-run,
// its backup takes over, the killed one restarted joins it (state transfer, with the replication
// token), and no acknowledged push is lost.
TEST(ReplicationCredentialTest, ThePeerWithTheReplicationTokenReplicatesAndTakesOver) {
  Secrets secrets;
  // Over mutual TLS too: a replica presents its ps certificate to its peer as a client.
  ASSERT_TRUE(secrets.MakeCertificates());
  LocalCluster cluster(ExecutableDir(), NewRunDir(), secrets.MutualTlsAndTokens());
  ASSERT_TRUE(cluster.StartShards(1, kMlp, 1, {}, /*replicas=*/2).ok());
  constexpr int kSteps = 600;
  ASSERT_TRUE(
      cluster
          .StartWorker(
              0, 1, {"--hidden=32", absl::StrCat("--steps=", kSteps), "--push_delay=fixed:0.005"})
          .ok());
  ASSERT_TRUE(WaitForStats(cluster, 0, [](const v1::StatsResponse& s) {
    return s.replica_role() == "primary" && s.version() >= 100;
  }));
  cluster.shards()[0].Signal(SIGKILL);
  ASSERT_EQ(*cluster.shards()[0].Wait(absl::Seconds(10)), 128 + SIGKILL);
  ASSERT_TRUE(WaitForStats(cluster, 1, [](const v1::StatsResponse& s) {
    return s.replica_role() == "primary" && s.replica_epoch() == 2;
  }));
  ASSERT_TRUE(cluster.RestartShard(0).ok());
  ASSERT_TRUE(WaitForStats(
      cluster, 0, [](const v1::StatsResponse& s) { return s.replica_role() == "backup"; }));
  absl::StatusOr<int> code = cluster.worker(0)->Wait(absl::Minutes(3));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << ReadFile(cluster.run_dir() + "/worker-0.log");
  for (int process : {1, 0}) {
    EXPECT_TRUE(WaitForStats(cluster, process, [](const v1::StatsResponse& s) {
      return s.version() == kSteps && s.replica_epoch() == 2;
    })) << cluster.ProcessName(process);
  }
  EXPECT_EQ(cluster.Stop(), "");
}

// Replication/Status checks the caller first, then parses: a stranger's bytes are never looked
// at, and a request that does not parse gets INVALID_ARGUMENT naming the method (not INTERNAL).
TEST(ReplicationCredentialTest, StatusAuthenticatesBeforeItParses) {
  const std::string kStatus = "/ps.v1.Replication/Status";
  const std::string garbage(8, '\xff');  // field 31, wire type 7, which does not exist
  Secrets secrets;
  ClusterSecurity security = secrets.Tokens();
  WriteFile(secrets.File("replication-token"), std::string(kReplicationToken) + "\n");
  security.replication_token_file = secrets.File("replication-token");
  LocalCluster cluster(ExecutableDir(), NewRunDir(), security);
  ASSERT_TRUE(cluster.StartShards(1, "flat:1000", 1, {}, /*replicas=*/2).ok());
  ASSERT_TRUE(WaitForStats(
      cluster, 1, [](const v1::StatsResponse& s) { return s.replica_role() == "backup"; }));
  for (int process : {0, 1}) {
    const std::string address = cluster.ProcessAddress(process);
    for (const std::string& bytes : {garbage, std::string()}) {
      EXPECT_EQ(RawUnaryCall(address, kStatus, bytes, "").error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
      EXPECT_EQ(RawUnaryCall(address, kStatus, bytes, kWrongToken).error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
      for (const char* token : {kWriteToken, kReadToken}) {
        grpc::Status s = RawUnaryCall(address, kStatus, bytes, token);
        EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
        EXPECT_NE(s.error_message().find("needs the replication credential"), std::string::npos)
            << s.error_message();
      }
    }
    grpc::Status bad = RawUnaryCall(address, kStatus, garbage, kReplicationToken);
    EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad.error_message();
    EXPECT_EQ(bad.error_message(), "cannot parse Replication/Status request");
    EXPECT_TRUE(RawUnaryCall(address, kStatus, "", kReplicationToken).ok());
    // The replication token is for replication only.
    absl::StatusOr<v1::StatsResponse> stats = cluster.ProcessStats(process, absl::Seconds(10));
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->replica_role(), process == 0 ? "primary" : "backup");
  }
  std::unique_ptr<ShardedClient> replicator;
  {
    ClientOptions options;
    options.security = Plaintext(kReplicationToken);
    replicator = std::make_unique<ShardedClient>(std::vector<std::string>{cluster.ShardAddress(0)},
                                                 ModelIdentity{"flat:1000", 1000, 1}, 0, options);
  }
  EXPECT_EQ(replicator->Register().status().code(), absl::StatusCode::kPermissionDenied);

  // Without any token (the plaintext-loopback mode) there is nobody to check: the bytes are parsed
  // at once, and still answered with INVALID_ARGUMENT.
  LocalCluster no_tokens(ExecutableDir(), NewRunDir());
  ASSERT_TRUE(no_tokens.StartShards(1, "flat:1000", 1, {}, /*replicas=*/2).ok());
  grpc::Status bad = RawUnaryCall(no_tokens.ProcessAddress(0), kStatus, garbage, "");
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad.error_message();
  EXPECT_EQ(bad.error_message(), "cannot parse Replication/Status request");
  EXPECT_TRUE(RawUnaryCall(no_tokens.ProcessAddress(0), kStatus, "", "").ok());
}

// --- Per-worker identity ---

ClusterSecurity WithWorkerIdentity(ClusterSecurity s) {
  s.worker_identity = true;
  return s;
}

class WorkerIdentityTest : public ::testing::Test {
 protected:
  Secrets secrets_;
  GuardedShards shards_{2, WithWorkerIdentity(secrets_.Tokens()),
                        Plaintext(WorkerToken(kWriteToken, 0))};
  void SetUp() override { ASSERT_TRUE(shards_.ok()); }
};

TEST_F(WorkerIdentityTest, OneWorkersTokenCannotActAsAnother) {
  // Before: any holder of the job's token could register as another worker's id, and the real
  // worker then exited "superseded". Here worker 0 holds its own token; worker 1's token and the
  // job's token try every call as worker 0.
  const std::string address = shards_.cluster().ShardAddress(0);
  for (const std::string& token : {WorkerToken(kWriteToken, 1), std::string(kWriteToken)}) {
    std::unique_ptr<ShardedClient> impostor = shards_.Client(0, Plaintext(token));
    std::vector<float> fifty(kParams, 50.0f), values(kParams);
    std::vector<std::pair<std::string, absl::Status>> calls = {
        {"Register", impostor->Register().status()},
        {"Push", impostor->Push(fifty, 0).status()},
        {"Push with sequence 2^62", impostor->Push(fifty, kHugeSequence).status()},
        {"Heartbeat", impostor->Heartbeat(absl::Seconds(10))},
        {"Leave", impostor->Leave(absl::Seconds(10))},
        {"Pull", impostor->Pull(absl::MakeSpan(values)).status()},
    };
    for (const auto& [call, status] : calls) {
      EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << call << ": " << status;
    }
    EXPECT_EQ(AttachSharedMemory(address, 0, token).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  absl::Status named = shards_.Client(0, Plaintext(WorkerToken(kWriteToken, 1)))->Register().status();
  EXPECT_NE(named.message().find("worker 1's token cannot act as worker 0"), std::string::npos)
      << named;
  shards_.ExpectWeights();
  // A worker's token does not checkpoint (the job's token does; this job keeps no checkpoints).
  EXPECT_EQ(CheckpointNow(address, WorkerToken(kWriteToken, 1)).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(CheckpointNow(address, kWriteToken).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  // Worker 0 was not superseded: its pushes still apply. Worker 1's token works as worker 1.
  shards_.ExpectTheOwnersFirstPushApplied();
  EXPECT_TRUE(shards_.Client(1, Plaintext(WorkerToken(kWriteToken, 1)))->Register().ok());
  // The operator's write token still initialises (here: already done, so it changes nothing).
  absl::StatusOr<int> initialised =
      shards_.Client(-1, Plaintext(kWriteToken))->Initialize(std::vector<float>(kParams, 9.0f));
  ASSERT_TRUE(initialised.ok()) << initialised.status();
  EXPECT_EQ(*initialised, 0);
  // The impostors' pushes were counted as rejected.
  absl::StatusOr<std::vector<v1::StatsResponse>> after = shards_.owner().Stats();
  ASSERT_TRUE(after.ok());
  EXPECT_GE((*after)[0].pushes_rejected(), 4);
}

TEST(WorkerIdentityClusterTest, LaunchedWorkersTrainEachWithItsOwnTokenAndNotTheJobs) {
  // The launcher's way: the shards get --worker_identity, worker R run_dir/worker-R.token. The
  // job's token comes from PS_TOKEN here, which the workers must not inherit.
  ScopedEnv job_token("PS_TOKEN", kWriteToken);
  ClusterSecurity security;
  security.worker_identity = true;
  LocalCluster cluster(ExecutableDir(), NewRunDir(), security);
  ASSERT_TRUE(cluster.StartShards(2, "mlp:784-16-10", 2, {"--optimizer=sgd"}).ok());
  EXPECT_EQ(ReadFile(cluster.run_dir() + "/token"), kWriteToken);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(cluster
                    .StartWorker(rank, 2,
                                 {"--model=mlp:784-16-10", "--steps=30", "--push_delay=fixed:0.05"})
                    .ok());
  }
  ASSERT_TRUE(WaitForStep(cluster.run_dir() + "/worker-1.csv", 1, absl::Minutes(1)));
  const std::string environment =
      ReadFile(absl::StrCat("/proc/", cluster.worker(1)->pid(), "/environ"));
  EXPECT_FALSE(environment.empty());
  EXPECT_EQ(environment.find(kWriteToken), std::string::npos);
  for (int rank = 0; rank < 2; ++rank) {
    absl::StatusOr<int> code = cluster.worker(rank)->Wait(absl::Minutes(2));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0) << ReadFile(absl::StrCat(cluster.run_dir(), "/worker-", rank, ".log"));
    EXPECT_EQ(ReadFile(absl::StrCat(cluster.run_dir(), "/worker-", rank, ".token")),
              WorkerToken(kWriteToken, rank));
  }
  EXPECT_NE(ReadFile(cluster.run_dir() + "/ps-0.log").find("workers' own tokens"),
            std::string::npos);
  absl::StatusOr<v1::StatsResponse> stats = cluster.ProcessStats(0, absl::Seconds(10));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->pushes_applied(), 60);
}

// --- Where daemons listen, and bad security flags ---

// Runs a daemon to completion; returns its exit code and output. A ps is given a job (model and
// workers) so that it gets as far as its security flags.
std::pair<int, std::string> RunDaemon(std::vector<std::string> argv) {
  std::string log = NewRunDir() + "/out.log";
  if (argv[0] == "ps") argv.insert(argv.begin() + 1, {"--model=flat:4", "--num_workers=1"});
  argv[0] = ExecutableDir() + "/" + argv[0];
  absl::StatusOr<Subprocess> p = Subprocess::Start(argv, log);
  EXPECT_TRUE(p.ok());
  absl::StatusOr<int> code = p.ok() ? p->Wait(absl::Seconds(90)) : p.status();
  EXPECT_TRUE(code.ok());
  return {code.ok() ? *code : -1, ReadFile(log)};
}

TEST(ListenTest, ANonLoopbackAddressNeedsATokenOrMutualTlsOrInsecure) {
  auto [code, output] = RunDaemon({"ps", "--host=0.0.0.0", "--port=0"});
  EXPECT_EQ(code, 1);
  EXPECT_NE(output.find("ps: refusing to listen on --host=0.0.0.0: not a loopback address"),
            std::string::npos)
      << output;
  auto [worker_code, worker_output] =
      RunDaemon({"worker", "--ps=127.0.0.1:1", "--health_host=0.0.0.0", "--health_port=0"});
  EXPECT_EQ(worker_code, 1);
  EXPECT_NE(worker_output.find("worker: refusing to listen on --health_host=0.0.0.0"),
            std::string::npos)
      << worker_output;

  // --insecure: it starts, says what it is doing, and serves (here reached through loopback).
  LocalCluster insecure(ExecutableDir(), NewRunDir());
  ASSERT_TRUE(insecure.StartShards(1, "flat:4", 1, {"--host=0.0.0.0", "--insecure"}).ok());
  EXPECT_NE(ReadFile(insecure.run_dir() + "/ps-0.log")
                .find("W ps[0]] --insecure: listening on --host=0.0.0.0 where anyone"),
            std::string::npos);
  ShardedClient plain({insecure.ShardAddress(0)}, {"unused", 1, 1}, -1);
  EXPECT_TRUE(plain.Stats().ok());

  // A token is enough, with a warning that it travels in plaintext.
  Secrets secrets;
  LocalCluster with_token(ExecutableDir(), NewRunDir(), secrets.Tokens());
  ASSERT_TRUE(with_token.StartShards(1, "flat:4", 1, {"--host=0.0.0.0"}).ok());
  EXPECT_NE(ReadFile(with_token.run_dir() + "/ps-0.log").find("the token travels in plaintext"),
            std::string::npos);
}

TEST(ListenTest, ASecondPsOnAPortInUseExitsNamingIt) {
  // Before: gRPC's SO_REUSEPORT let a second ps (a stale one from an earlier run) listen on the
  // same port, and the kernel split the workers between the two.
  LocalCluster first(ExecutableDir(), NewRunDir());
  ASSERT_TRUE(first.StartShards(1, "flat:4", 1, {}).ok());
  const std::string address = first.ShardAddress(0);
  const std::string port = address.substr(address.rfind(':') + 1);
  auto [code, output] = RunDaemon({"ps", "--port=" + port});
  EXPECT_EQ(code, 1);
  EXPECT_NE(output.find("ps: cannot listen on 127.0.0.1:" + port + ": port " + port +
                        " on 127.0.0.1 is in use"),
            std::string::npos)
      << output;
  EXPECT_TRUE(RawUnaryCall(address, "/ps.v1.ParameterServer/GetStats", "").ok());
}

TEST(ConnectionTest, DaemonsAndToolsNameTheCauseWithinSeconds) {
  // Before: each of these waited the whole retry budget (60 s, tools included) and ended with
  // gRPC's "failed to connect to all addresses ... Socket closed".
  Secrets secrets;
  ASSERT_TRUE(secrets.MakeCertificates());
  ClusterSecurity mutual = secrets.MutualTlsAndTokens();
  LocalCluster tls_cluster(ExecutableDir(), NewRunDir(), mutual);
  ASSERT_TRUE(tls_cluster.StartShards(1, "mlp:784-8-10", 1, {}).ok());
  LocalCluster plain_cluster(ExecutableDir(), NewRunDir());
  ASSERT_TRUE(plain_cluster.StartShards(1, "mlp:784-8-10", 1, {}).ok());
  struct Case {
    std::vector<std::string> argv;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {{"worker", "--ps=" + tls_cluster.ShardAddress(0), "--hidden=8", "--rank=0",
        "--num_workers=1", "--token_file=" + mutual.token_file},
       "worker: shard 0 (" + tls_cluster.ShardAddress(0) +
           "): the shard serves TLS and this client connects in plaintext"},
      {{"psctl", "status", "--ps=" + plain_cluster.ShardAddress(0), "--hidden=8",
        "--tls_ca=" + mutual.ca},
       "psctl: shard 0 (" + plain_cluster.ShardAddress(0) + "): the shard does not speak TLS"},
      {{"psctl", "status", "--ps=127.0.0.1:1", "--hidden=8"},
       "psctl: shard 0 (127.0.0.1:1): connection refused: nothing listens on 127.0.0.1:1"},
      {{"export_model", "--ps=127.0.0.1:1", "--hidden=8", "--out=" + secrets.File("m.st")},
       "connection refused: nothing listens on 127.0.0.1:1"},
  };
  for (const Case& c : cases) {
    const absl::Time start = absl::Now();
    auto [code, output] = RunDaemon(c.argv);
    const absl::Duration took = absl::Now() - start;
    std::cout << c.argv[0] << " " << c.argv[1] << ": " << took << "\n";
    EXPECT_EQ(code, 1) << output;
    EXPECT_NE(output.find(c.reason), std::string::npos) << output;
    EXPECT_LT(took, absl::Seconds(30)) << output;  // the retry budget was 60 s
  }
}

TEST(ListenTest, BadSecurityFlagsExitWithAOneLineReason) {
  Secrets secrets;
  ASSERT_TRUE(secrets.MakeCertificates());
  WriteFile(secrets.File("empty-token"), "\n");
  WriteFile(secrets.File("token"), kWriteToken);
  WriteFile(secrets.File("worker-1.token"), WorkerToken(kWriteToken, 1));
  const std::string server = secrets.Cert("server.pem"), client_key = secrets.Cert("client.key");
  struct Case {
    std::vector<std::string> argv;
    std::string reason;
  };
  std::vector<Case> cases = {
      {{"ps", "--tls_cert=/nonexistent.pem", "--tls_key=/nonexistent.key"},
       "ps: cannot read --tls_cert=/nonexistent.pem: No such file or directory"},
      {{"ps", "--tls_cert=" + server}, "ps: --tls_cert and --tls_key go together"},
      {{"ps", "--tls_cert=" + server, "--tls_key=" + client_key},
       "ps: --tls_key=" + client_key + " does not belong to --tls_cert=" + server},
      {{"ps", "--tls_cert=" + client_key, "--tls_key=" + client_key},
       "ps: --tls_cert=" + client_key + " holds no PEM certificate"},
      {{"ps", "--tls_ca=" + secrets.Cert("ca.pem")}, "ps: --tls_ca (mutual TLS) needs --tls_cert"},
      {{"ps", "--token_file=" + secrets.File("empty-token")}, "is empty"},
      {{"ps", "--read_token_file=" + secrets.Cert("ca.pem")}, "must be printable ASCII"},
      {{"ps", "--token_file=" + secrets.File("missing")}, "ps: cannot read --token_file="},
      {{"ps", "--peer=127.0.0.1:1", "--token_file=" + secrets.File("token")},
       "ps: --peer with a token or mutual TLS needs --replication_token_file"},
      {{"ps", "--peer=127.0.0.1:1", "--token_file=" + secrets.File("token"),
        "--replication_token_file=" + secrets.File("token")},
       "the replication token must differ from the write and read-only tokens"},
      {{"ps", "--replication_token_file=" + secrets.File("empty-token")}, "is empty"},
      {{"worker", "--ps=127.0.0.1:1", "--tls_cert=" + server, "--tls_key=" + client_key},
       "worker: --tls_cert/--tls_key need --tls_ca"},
      {{"evaluator", "--ps=127.0.0.1:1", "--tls_ca=/nonexistent"},
       "evaluator: cannot read --tls_ca=/nonexistent: No such file or directory"},
      {{"ps", "--worker_identity"}, "ps: --worker_identity needs the write token"},
      {{"worker", "--ps=127.0.0.1:1", "--rank=0", "--num_workers=2",
        "--token_file=" + secrets.File("worker-1.token")},
       "worker: the token (--token_file or PS_TOKEN) is worker 1's own, and this is worker 0"},
      {{"psctl", "worker-token", "--token_file=" + secrets.File("token")},
       "psctl: psctl worker-token needs --rank=R"},
      {{"psctl", "worker-token", "--rank=1", "--token_file=" + secrets.File("worker-1.token")},
       "psctl: --token_file holds a worker's own token; give the job's write token"},
  };
  for (const Case& c : cases) {
    auto [code, output] = RunDaemon(c.argv);
    EXPECT_EQ(code, 1) << c.argv.back();
    EXPECT_NE(output.find(c.reason), std::string::npos) << c.argv.back() << " printed: " << output;
    EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
  }
  WriteFile(secrets.File("read-only"), kReadToken);
  auto [code, output] = RunDaemon({"ps", "--read_token_file=" + secrets.File("read-only")});
  EXPECT_NE(output.find("a read-only token needs a write token too"), std::string::npos) << output;
  // psctl makes a worker's own token from the job's.
  auto [made, token] =
      RunDaemon({"psctl", "worker-token", "--rank=2", "--token_file=" + secrets.File("token")});
  EXPECT_EQ(made, 0);
  EXPECT_EQ(token, WorkerToken(kWriteToken, 2) + "\n");
}

// --- The pieces, without processes ---

TEST(TokenAuthenticatorTest, CodesForEachKindOfCaller) {
  absl::StatusOr<TokenAuthenticator> a = TokenAuthenticator::Create(kWriteToken, kReadToken);
  ASSERT_TRUE(a.ok());
  auto code = [&](const std::string& header, Access needed) {
    return a->Authorize(header, needed, "Call").status().code();
  };
  for (Access needed : {Access::kRead, Access::kWrite}) {
    EXPECT_EQ(code(BearerValue(kWriteToken), needed), absl::StatusCode::kOk);
    EXPECT_EQ(code("", needed), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(code(BearerValue(kWrongToken), needed), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(code(kWriteToken, needed), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(code("bearer " + std::string(kWriteToken), needed),
              absl::StatusCode::kUnauthenticated);
  }
  EXPECT_EQ(code(BearerValue(kReadToken), Access::kRead), absl::StatusCode::kOk);
  EXPECT_EQ(code(BearerValue(kReadToken), Access::kWrite), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(TokenAuthenticator().Authorize("", Access::kWrite, "Call").ok());
  EXPECT_FALSE(TokenAuthenticator::Create("", kReadToken).ok());
  EXPECT_FALSE(TokenAuthenticator::Create(kWriteToken, kWriteToken).ok());
  // Without a replication token, Replication calls fail closed where the job has tokens.
  EXPECT_EQ(code(BearerValue(kWriteToken), Access::kReplicate),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(TokenAuthenticator().Authorize("", Access::kReplicate, "Call").ok());
}

TEST(TokenAuthenticatorTest, OnlyTheReplicationTokenReplicatesAndItDoesNothingElse) {
  absl::StatusOr<TokenAuthenticator> a =
      TokenAuthenticator::Create(kWriteToken, kReadToken, kReplicationToken);
  ASSERT_TRUE(a.ok()) << a.status();
  auto code = [&](const std::string& header, Access needed) {
    return a->Authorize(header, needed, "Call").status().code();
  };
  EXPECT_EQ(code(BearerValue(kReplicationToken), Access::kReplicate), absl::StatusCode::kOk);
  EXPECT_EQ(code(BearerValue(kWriteToken), Access::kReplicate),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(code(BearerValue(kReadToken), Access::kReplicate), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(code(BearerValue(kWrongToken), Access::kReplicate), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(code("", Access::kReplicate), absl::StatusCode::kUnauthenticated);
  for (Access needed : {Access::kRead, Access::kWrite}) {
    EXPECT_EQ(code(BearerValue(kReplicationToken), needed), absl::StatusCode::kPermissionDenied);
  }
  // A job without tokens (mutual TLS alone) may still guard replication.
  absl::StatusOr<TokenAuthenticator> alone = TokenAuthenticator::Create("", "", kReplicationToken);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_FALSE(alone->enabled());
  EXPECT_TRUE(alone->Authorize("", Access::kWrite, "Push").ok());
  EXPECT_EQ(alone->Authorize("", Access::kReplicate, "Replicate").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(
      alone->Authorize(BearerValue(kReplicationToken), Access::kReplicate, "Replicate").ok());
  EXPECT_FALSE(TokenAuthenticator::Create(kWriteToken, kReadToken, kWriteToken).ok());
  EXPECT_FALSE(TokenAuthenticator::Create(kWriteToken, kReadToken, kReadToken).ok());
  EXPECT_FALSE(TokenAuthenticator::Create("", "", "").ok());
}

TEST(TokenAuthenticatorTest, AWorkersOwnTokenActsAsThatWorkerOnly) {
  absl::StatusOr<TokenAuthenticator> a =
      TokenAuthenticator::Create(kWriteToken, kReadToken, "", /*worker_identity=*/true);
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string worker3 = WorkerToken(kWriteToken, 3);
  EXPECT_EQ(WorkerTokenRank(worker3), 3);
  EXPECT_EQ(worker3, WorkerToken(kWriteToken, 3));  // made again the same
  EXPECT_NE(worker3, WorkerToken(kWriteToken, 4));
  EXPECT_NE(worker3, WorkerToken(kWrongToken, 3));  // another job's
  // Worker 3's token reads and writes as worker 3, as an observer, and as no other worker.
  for (Access needed : {Access::kRead, Access::kWrite}) {
    absl::StatusOr<Caller> caller = a->Authorize(BearerValue(worker3), needed, "Push");
    ASSERT_TRUE(caller.ok()) << caller.status();
    EXPECT_EQ(caller->worker, 3);
    EXPECT_TRUE(CheckActsAs(*caller, 3, "Push").ok());
    EXPECT_TRUE(CheckActsAs(*caller, -1, "Pull").ok());
    absl::Status other = CheckActsAs(*caller, 1, "Push");
    EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_NE(other.message().find("worker 3's token cannot act as worker 1"), std::string::npos)
        << other;
  }
  EXPECT_EQ(a->Authorize(BearerValue(worker3), Access::kAdmin, "Checkpoint").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(a->Authorize(BearerValue(worker3), Access::kReplicate, "Replicate").status().code(),
            absl::StatusCode::kPermissionDenied);
  // The job's token acts as no worker (it stays the operator's), but still reads and checkpoints.
  absl::StatusOr<Caller> job = a->Authorize(BearerValue(kWriteToken), Access::kWrite, "Register");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(CheckActsAs(*job, 0, "Register").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(CheckActsAs(*job, -1, "Register").ok());
  EXPECT_TRUE(a->Authorize(BearerValue(kWriteToken), Access::kAdmin, "Checkpoint").ok());
  // Forgeries: another job's worker token, a rank swapped into worker 3's MAC, a digit changed.
  std::string swapped = worker3;
  swapped.replace(0, std::string("worker-3").size(), "worker-1");
  std::string changed = worker3;
  changed.back() = changed.back() == '0' ? '1' : '0';
  for (const std::string& forged : {WorkerToken(kWrongToken, 3), swapped, changed,
                                    worker3.substr(0, worker3.size() - 1)}) {
    EXPECT_EQ(a->Authorize(BearerValue(forged), Access::kWrite, "Push").status().code(),
              absl::StatusCode::kUnauthenticated)
        << forged;
  }
  // Without per-worker identity, a worker's token is no token at all, and says why.
  absl::StatusOr<TokenAuthenticator> plain = TokenAuthenticator::Create(kWriteToken, kReadToken);
  ASSERT_TRUE(plain.ok());
  absl::Status refused = plain->Authorize(BearerValue(worker3), Access::kWrite, "Push").status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(refused.message().find("--worker_identity"), std::string::npos) << refused;
  EXPECT_EQ(plain->Authorize(BearerValue(kWriteToken), Access::kWrite, "Push")->worker,
            Caller::kAnyWorker);
  EXPECT_FALSE(TokenAuthenticator::Create("", "", kReplicationToken, true).ok());
  // Only the exact form WorkerToken writes has a rank; anything else is no worker's token.
  const std::string mac = worker3.substr(worker3.find(':') + 1);
  std::string upper = mac;
  for (char& c : upper) c = absl::ascii_toupper(c);
  for (const std::string& malformed :
       {std::string("worker-3"), "worker-x:" + mac, "worker--1:" + mac, "worker-+3:" + mac,
        "worker- 3:" + mac, "worker-03:" + mac, "worker-99999999999:" + mac, "worker-3:" + upper,
        "worker-3:" + mac.substr(1)}) {
    EXPECT_FALSE(WorkerTokenRank(malformed).has_value()) << malformed;
    absl::Status s = a->Authorize(BearerValue(malformed), Access::kWrite, "Push").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << malformed;
  }
}

TEST(ListenHostTest, LoopbackIsAlwaysAllowed) {
  for (const char* host : {"127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]"}) {
    EXPECT_TRUE(IsLoopbackHost(host)) << host;
    EXPECT_TRUE(CheckListenHost("--host", host, ServerSecurity{}, false).ok()) << host;
  }
  for (const char* host : {"0.0.0.0", "::", "[::]", "", "10.0.0.1", "128.0.0.1", "example.com"}) {
    EXPECT_FALSE(IsLoopbackHost(host)) << host;
    EXPECT_EQ(CheckListenHost("--host", host, ServerSecurity{}, false).code(),
              absl::StatusCode::kFailedPrecondition)
        << host;
  }
}

}  // namespace
}  // namespace ps
