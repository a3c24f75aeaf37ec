// Server reflection on the daemons (transport/reflection.h): a real ps and an evaluator's health
// server list their services, and the ps hands out the descriptor of ps.v1.ParameterServer, so
// grpcurl-like tools can call a daemon without the .proto files.
#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "deploy/local_cluster.h"
#include "google/protobuf/descriptor.pb.h"
#include "proto/grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "tests/run_dir.h"

namespace ps {
namespace {

namespace reflection = grpc::reflection::v1alpha;

// One reflection request to the server at `address` and its answer.
absl::StatusOr<reflection::ServerReflectionResponse> Ask(
    const std::string& address, const reflection::ServerReflectionRequest& request) {
  auto stub = reflection::ServerReflection::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  auto stream = stub->ServerReflectionInfo(&context);
  reflection::ServerReflectionResponse response;
  if (!stream->Write(request) || !stream->WritesDone() || !stream->Read(&response)) {
    return absl::UnavailableError(absl::StrCat("no reflection answer from ", address, ": ",
                                               stream->Finish().error_message()));
  }
  reflection::ServerReflectionResponse more;
  while (stream->Read(&more)) {
  }
  grpc::Status status = stream->Finish();
  if (!status.ok()) return absl::UnavailableError(status.error_message());
  return response;
}

std::vector<std::string> Services(const std::string& address) {
  reflection::ServerReflectionRequest request;
  request.set_list_services("");
  absl::StatusOr<reflection::ServerReflectionResponse> answer = Ask(address, request);
  EXPECT_TRUE(answer.ok()) << answer.status();
  std::vector<std::string> names;
  if (answer.ok()) {
    for (const auto& s : answer->list_services_response().service()) names.push_back(s.name());
  }
  return names;
}

bool Has(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

TEST(ReflectionTest, DaemonsDescribeTheirServices) {
  LocalCluster cluster(ExecutableDir(), NewRunDir("reflection"));
  ASSERT_TRUE(cluster.StartShards(1, "mlp:784-8-10", 1, {}).ok());
  const std::string shard = cluster.ShardAddress(0);
  std::vector<std::string> services = Services(shard);
  EXPECT_TRUE(Has(services, "ps.v1.ParameterServer")) << services.size();
  EXPECT_TRUE(Has(services, "grpc.health.v1.Health"));

  reflection::ServerReflectionRequest request;
  request.set_file_containing_symbol("ps.v1.ParameterServer");
  absl::StatusOr<reflection::ServerReflectionResponse> answer = Ask(shard, request);
  ASSERT_TRUE(answer.ok()) << answer.status();
  bool found = false;
  for (const std::string& bytes : answer->file_descriptor_response().file_descriptor_proto()) {
    google::protobuf::FileDescriptorProto file;
    ASSERT_TRUE(file.ParseFromString(bytes));
    for (const auto& service : file.service()) {
      if (service.name() != "ParameterServer") continue;
      found = true;
      std::vector<std::string> methods;
      for (const auto& m : service.method()) methods.push_back(m.name());
      EXPECT_TRUE(Has(methods, "Push") && Has(methods, "Pull") && Has(methods, "GetStats"));
    }
  }
  EXPECT_TRUE(found) << "no descriptor of ps.v1.ParameterServer";

  // A worker's or evaluator's health server describes itself too.
  ASSERT_TRUE(cluster.StartEvaluator({"--hidden=8", "--health_port=0"}).ok());  // waits: no worker
  std::string health;
  for (absl::Time give_up = absl::Now() + absl::Seconds(30); health.empty();) {
    const std::string log = ReadFile(cluster.run_dir() + "/evaluator.log");
    const size_t at = log.find("health service on port ");
    const size_t end = at == std::string::npos ? at : log.find('\n', at);
    if (end != std::string::npos) health = "127.0.0.1:" + log.substr(at + 23, end - at - 23);
    ASSERT_LT(absl::Now(), give_up) << log;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(Has(Services(health), "grpc.health.v1.Health"));
}

}  // namespace
}  // namespace ps
