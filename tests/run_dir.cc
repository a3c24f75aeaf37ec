#include "tests/run_dir.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/version.h"
#include "transport/security.h"
#include "deploy/local_cluster.h"
#include "deploy/subprocess.h"
#include "proto/ps.grpc.pb.h"

namespace ps {
namespace {

// The directories made during the current test; cleaned up when it ends.
std::vector<std::string>& Made() {
  static std::vector<std::string>* dirs = new std::vector<std::string>;
  return *dirs;
}

class RunDirCleaner : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo& test) override {
    for (const std::string& dir : Made()) {
      if (test.result()->Passed()) {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
      } else {
        std::cout << "run directory kept: " << dir << std::endl;
      }
    }
    Made().clear();
  }
};

// Registered before main(): the tests link gtest_main.
const bool kRegistered = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new RunDirCleaner);
  return true;
}();

}  // namespace

std::string NewRunDir(const std::string& prefix) {
  std::string pattern = ::testing::TempDir() + "/" + prefix + "-XXXXXX";
  std::string dir = mkdtemp(pattern.data());
  Made().push_back(dir);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

double Column(const std::string& csv_line, int column) {
  std::vector<std::string> f = absl::StrSplit(csv_line, ',');
  double v = NAN;
  if (column < static_cast<int>(f.size())) (void)absl::SimpleAtod(f[column], &v);
  return v;
}

bool WaitForStep(const std::string& csv, int64_t step, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (Column(LastLine(csv), 0) >= step) return true;
    absl::SleepFor(absl::Milliseconds(10));  // a short overshoot past `step`/`version`
  }
  return false;
}

double LongestGapSeconds(const std::string& csv) {
  std::ifstream in(csv);
  std::string line;
  std::getline(in, line);  // header
  double previous = -1, longest = 0;
  while (std::getline(in, line)) {
    double t = Column(line, 1);
    if (previous >= 0) longest = std::max(longest, t - previous);
    previous = t;
  }
  return longest;
}

v1::StatsResponse Stats(const std::string& address) {
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::StatsResponse response;
  EXPECT_TRUE(stub->GetStats(&context, v1::StatsRequest(), &response).ok());
  return response;
}

grpc::Status RawUnaryCall(const std::string& address, const std::string& method,
                          const std::string& bytes, const std::string& token) {
  grpc::GenericStub generic(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) context.AddMetadata(kAuthorizationMetadata, BearerValue(token));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::Status status;
  absl::Notification done;
  generic.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                    [&](grpc::Status s) {
                      status = s;
                      done.Notify();
                    });
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  return status;
}

bool WaitForVersion(const std::string& address, int64_t version, absl::Duration timeout) {
  for (absl::Time deadline = absl::Now() + timeout; absl::Now() < deadline;) {
    if (Stats(address).version() >= version) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

bool WaitForRole(const std::string& address, const std::string& role, absl::Duration timeout) {
  for (absl::Time deadline = absl::Now() + timeout; absl::Now() < deadline;) {
    if (Stats(address).replica_role() == role) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

void StartReplicated(LocalCluster& cluster, const std::string& fingerprint,
                     const std::vector<std::string>& flags, int workers) {
  ASSERT_TRUE(cluster.StartShards(1, fingerprint, workers, flags, /*replicas=*/2).ok());
  ASSERT_TRUE(WaitForRole(cluster.ProcessAddress(1), "backup", absl::Seconds(30)));
}

grpc::Status RawAttachDataPlane(const std::string& address, int worker, const ModelIdentity& model,
                                const std::string& token, v1::AttachDataPlaneResponse* response,
                                int64_t incarnation) {
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  if (!token.empty()) context.AddMetadata(kAuthorizationMetadata, BearerValue(token));
  v1::AttachDataPlaneRequest request;
  request.set_worker_id(worker);
  request.mutable_model()->set_fingerprint(model.fingerprint);
  request.mutable_model()->set_total_params(model.total_params);
  request.mutable_model()->set_num_shards(model.num_shards);
  request.set_incarnation(incarnation);
  StampRelease(&request);
  return stub->AttachDataPlane(&context, request, response);
}

bool MakeTestCertificates(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string log = dir + "/make_test_certs.log";
  absl::StatusOr<Subprocess> script = Subprocess::Start(
      {"/bin/bash", std::string(PS_SOURCE_DIR) + "/deploy/make_test_certs.sh", dir}, log);
  absl::StatusOr<int> code = script.ok() ? script->Wait(absl::Minutes(1)) : script.status();
  if (code.ok() && *code == 0) return true;
  ADD_FAILURE() << "make_test_certs.sh: " << code.status() << "\n" << ReadFile(log);
  return false;
}

}  // namespace ps
