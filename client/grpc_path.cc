#include "client/grpc_path.h"

#include <grpcpp/impl/client_unary_call.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "transport/chunking.h"
#include "transport/grpc_method.h"
#include "transport/grpc_status.h"
#include "transport/tensor_codec.h"

namespace ps {
namespace {

using Writer = grpc::ClientWriter<grpc::ByteBuffer>;

// Streams `values` as `Chunk` messages of `type` values on raw bytes, the first also carrying
// `first`'s header. Each chunk is encoded (float32: copied) into a buffer its slice owns: gRPC may
// still hold a failed call's bytes after the call returned, when the caller may reuse or free
// `values`. Returns how many values were saturated to the type's range.
template <typename Chunk>
int64_t WriteTensorChunks(Writer* writer, const Chunk& first, absl::Span<const float> values,
                          WireType type) {
  bool ok = true;
  int64_t saturated = 0;
  const std::string head = first.SerializeAsString();
  ForEachChunk(values, kChunkBytes / WireBytes(type), [&](int64_t index, std::string_view raw) {
    if (!ok) return;
    absl::Span<const float> piece(reinterpret_cast<const float*>(raw.data()),
                                  raw.size() / sizeof(float));
    auto encoded = std::make_shared<std::string>();
    saturated += EncodeValues(piece, type, encoded.get());
    ok = writer->Write(EncodeWithTensor(index == 0 ? head : std::string(), Chunk::kDataFieldNumber,
                                        *encoded, encoded));
  });
  return saturated;
}

// Streams a compressed tensor as `Chunk` messages of whole units (a block, a pair), the first also
// carrying `first`'s header; the slices reference `tensor`, which they keep alive.
template <typename Chunk>
void WriteCompressedChunks(Writer* writer, const Chunk& first,
                           const std::shared_ptr<const CompressedTensor>& tensor) {
  std::string head = first.SerializeAsString();
  bool ok = true;
  ForEachUnitChunk(
      tensor->bytes, CompressedUnitBytes(tensor->compressor), [&](std::string_view piece) {
        if (!ok) return;
        ok = writer->Write(
            EncodeWithTensor(std::exchange(head, {}), Chunk::kDataFieldNumber, piece, tensor));
      });
}

std::unique_ptr<grpc::internal::RpcMethod> ClientStream(const std::shared_ptr<grpc::Channel>& c,
                                                        absl::string_view name) {
  return std::make_unique<grpc::internal::RpcMethod>(
      MethodPath<v1::ParameterServer>(name), grpc::internal::RpcMethod::CLIENT_STREAMING, c);
}

}  // namespace

GrpcPath::GrpcPath(std::shared_ptr<grpc::Channel> channel)
    : channel_(std::move(channel)),
      stub_(v1::ParameterServer::NewStub(channel_)),
      initialize_(ClientStream(channel_, "Initialize")),
      push_(ClientStream(channel_, "Push")) {}

AttemptEnd GrpcPath::Push(const PushPart& part, const PathCall& call, PushDone* done) {
  if (std::optional<AttemptEnd> end = AwaitFinal(part.filling, *call.context)) return *end;
  v1::PushChunk first;
  *first.mutable_header() = part.header;
  std::unique_ptr<Writer> writer(grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
      channel_.get(), *push_, call.context, &done->response));
  if (part.compressed != nullptr) {
    WriteCompressedChunks(writer.get(), first, part.compressed);
  } else {
    done->saturated = WriteTensorChunks(writer.get(), first, part.values, part.type);
  }
  writer->WritesDone();
  return AttemptEnd::FromShard(writer->Finish());
}

AttemptEnd GrpcPath::Pull(PullPart& part, const PathCall& call, v1::PullChunk* answer) {
  const v1::PullRequest& request = part.request;
  auto reader = stub_->Pull(call.context, request);
  ChunkAssembler assembler(part.values, part.type);
  v1::PullChunk chunk;
  absl::Status bad;
  for (bool first = true; reader->Read(&chunk); first = false) {
    if (first) {  // what heads the answer, not its values (a copy of those costs page faults)
      answer->set_version(chunk.version());
      answer->set_offset(chunk.offset());
      answer->set_dtype(chunk.dtype());
    }
    if (!bad.ok()) continue;  // drain the stream so Finish() returns
    if (chunk.dtype() != request.dtype()) {
      bad = absl::DataLossError(absl::StrCat("asked for dtype ", request.dtype(), ", got ",
                                             chunk.dtype(), " (an older shard?)"));
    } else if (chunk.offset() != request.offset() + assembler.received()) {
      bad = absl::DataLossError(absl::StrCat("chunk at offset ", chunk.offset(), ", expected ",
                                             request.offset() + assembler.received()));
    } else {
      const int64_t before = assembler.received();
      bad = assembler.Append(chunk.data());
      if (bad.ok()) part.seen(part.values.subspan(before, assembler.received() - before));
    }
  }
  AttemptEnd end = AttemptEnd::FromShard(reader->Finish());
  if (!end.ok()) return end;
  if (bad.ok()) bad = assembler.Finish();
  return AttemptEnd::Answered(bad);
}

grpc::Status GrpcPath::Initialize(const v1::InitializeHeader& header,
                                  absl::Span<const float> values, grpc::ClientContext* context,
                                  v1::InitializeResponse* response) {
  v1::InitializeChunk first;
  *first.mutable_header() = header;
  std::unique_ptr<Writer> writer(grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
      channel_.get(), *initialize_, context, response));
  WriteTensorChunks(writer.get(), first, values, WireType::kFloat32);
  writer->WritesDone();
  return writer->Finish();
}

grpc::Status GrpcPath::PushHeader(const v1::PushHeader& header, grpc::ClientContext* context,
                                  v1::PushResponse* response) {
  v1::PushChunk first;
  *first.mutable_header() = header;
  std::unique_ptr<Writer> writer(grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
      channel_.get(), *push_, context, response));
  grpc::Slice slice(first.SerializeAsString());
  writer->Write(grpc::ByteBuffer(&slice, 1));
  writer->WritesDone();
  return writer->Finish();
}

grpc::Status GrpcPath::PullHead(const v1::PullRequest& request, grpc::ClientContext* context,
                                v1::PullChunk* head) {
  auto reader = stub_->Pull(context, request);
  v1::PullChunk chunk;
  int chunks = 0;
  while (reader->Read(&chunk)) {
    if (chunks++ == 0) *head = chunk;
  }
  grpc::Status status = reader->Finish();
  if (status.ok() && (chunks != 1 || !head->data().empty())) {
    return grpc::Status(grpc::StatusCode::DATA_LOSS,
                        "a pull whose values travel elsewhere is one chunk naming them");
  }
  return status;
}

}  // namespace ps
