// The gRPC methods found by name (transport/grpc_method.h) are the ones the generated code serves and
// calls: a client calling the path it gives reaches the generated service's method, and a handler
// installed at the index it gives answers the generated stub's call. In-process servers on
// 127.0.0.1, ports chosen at run time.
#include "transport/grpc_method.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/method_handler.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/ps.grpc.pb.h"

namespace ps {
namespace {

// Every handler here answers ABORTED with the name of the method it serves.
grpc::Status Named(const std::string& method) {
  return grpc::Status(grpc::StatusCode::ABORTED, method);
}

// The generated services with their own handlers of the streamed methods.
class GeneratedParameterServer final : public v1::ParameterServer::Service {
  grpc::Status Initialize(grpc::ServerContext*, grpc::ServerReader<v1::InitializeChunk>*,
                          v1::InitializeResponse*) override {
    return Named("Initialize");
  }
  grpc::Status Push(grpc::ServerContext*, grpc::ServerReader<v1::PushChunk>*,
                    v1::PushResponse*) override {
    return Named("Push");
  }
};
class GeneratedReplication final : public v1::Replication::Service {
  grpc::Status Replicate(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::ReplicationMessage, v1::BackupMessage>*) override {
    return Named("Replicate");
  }
};

// A generated service whose `methods` are replaced, by index, with raw-bytes handlers (as
// ShardService and ReplicationService do); the others stay unimplemented.
template <typename GrpcService>
class ReplacedByIndex final : public GrpcService::Service {
 public:
  explicit ReplacedByIndex(const std::vector<std::string>& methods) {
    for (const std::string& method : methods) {
      this->MarkMethodStreamed(
          MethodIndex<GrpcService>(method),
          new grpc::internal::BidiStreamingHandler<ReplacedByIndex, grpc::ByteBuffer,
                                                   grpc::ByteBuffer>(
              [method](ReplacedByIndex*, grpc::ServerContext*,
                       grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>*) {
                return Named(method);
              },
              this));
    }
  }
};

// A plaintext server of `services` on 127.0.0.1 and a channel to it.
struct TestServer {
  explicit TestServer(const std::vector<grpc::Service*>& services) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    for (grpc::Service* s : services) builder.RegisterService(s);
    server = builder.BuildAndStart();
    channel =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  }
  ~TestServer() { server->Shutdown(); }
  std::unique_ptr<grpc::Server> server;
  std::shared_ptr<grpc::Channel> channel;
};

std::chrono::system_clock::time_point InTenSeconds() {
  return std::chrono::system_clock::now() + std::chrono::seconds(10);
}

TEST(GrpcMethodTest, PathsAreTheGeneratedServicesPaths) {
  EXPECT_STREQ(MethodPath<v1::ParameterServer>("Push"), "/ps.v1.ParameterServer/Push");
  EXPECT_STREQ(MethodPath<v1::Replication>("Replicate"), "/ps.v1.Replication/Replicate");
  // Interned: the same pointer every time, for gRPC's RpcMethod to keep.
  EXPECT_EQ(MethodPath<v1::ParameterServer>("Push"), MethodPath<v1::ParameterServer>("Push"));

  GeneratedParameterServer parameter_server;
  GeneratedReplication replication;
  TestServer server({&parameter_server, &replication});
  for (const char* path :
       {MethodPath<v1::ParameterServer>("Initialize"), MethodPath<v1::ParameterServer>("Push"),
        MethodPath<v1::Replication>("Replicate")}) {
    // A raw-bytes client stream, as ShardedClient sends Push and Initialize.
    grpc::internal::RpcMethod method(path, grpc::internal::RpcMethod::CLIENT_STREAMING,
                                     server.channel);
    grpc::ClientContext context;
    context.set_deadline(InTenSeconds());
    grpc::ByteBuffer response;
    std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(server.channel.get(), method,
                                                                      &context, &response));
    writer->WritesDone();
    grpc::Status status = writer->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED)
        << path << ": " << status.error_message();
    EXPECT_EQ(absl::StrCat("/", status.error_message()),
              std::string(path).substr(std::string(path).rfind('/')))
        << path;
  }
}

TEST(GrpcMethodTest, IndicesAreTheGeneratedServicesIndices) {
  ReplacedByIndex<v1::ParameterServer> parameter_server({"Initialize", "Push"});
  ReplacedByIndex<v1::Replication> replication({"Replicate"});
  TestServer server({&parameter_server, &replication});
  auto stub = v1::ParameterServer::NewStub(server.channel);
  auto replication_stub = v1::Replication::NewStub(server.channel);
  {
    grpc::ClientContext context;
    context.set_deadline(InTenSeconds());
    v1::PushResponse response;
    auto writer = stub->Push(&context, &response);
    writer->WritesDone();
    EXPECT_EQ(writer->Finish().error_message(), "Push");
  }
  {
    grpc::ClientContext context;
    context.set_deadline(InTenSeconds());
    v1::InitializeResponse response;
    auto writer = stub->Initialize(&context, &response);
    writer->WritesDone();
    EXPECT_EQ(writer->Finish().error_message(), "Initialize");
  }
  {
    grpc::ClientContext context;
    context.set_deadline(InTenSeconds());
    auto stream = replication_stub->Replicate(&context);
    stream->WritesDone();
    EXPECT_EQ(stream->Finish().error_message(), "Replicate");
  }
}

TEST(GrpcMethodDeathTest, AMethodTheProtoLacksIsAProgrammingError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(MethodIndex<v1::ParameterServer>("Nope"),
               "no gRPC method Nope in service ps.v1.ParameterServer");
}

}  // namespace
}  // namespace ps
