// Messages carrying a tensor, built for gRPC without copying the tensor: the message's other
// fields are serialised as usual, and the tensor's bytes become the last field of the message as a
// gRPC slice that references the caller's memory (the way TensorFlow's grpc_tensor_coding shares
// a tensor's backing store). Protobuf parses the result like any other message (field order does
// not matter on the wire).
//
// Received, such a message is split the other way (DecodeWithTensor): its other fields are parsed
// as usual, and the tensor's bytes go from gRPC's slices straight into the destination.
//
// Copies on the way (a 16-bit type's conversion takes the place of one), not counting the
// kernel's: a push, from the worker's gradient to the shard's buffer: 2 (the client's into buffers
// the slices own, since gRPC may hold a failed call's bytes after it returned; the shard's from
// gRPC's slices); a pull, from the shard's values to the worker's buffer: 3 (the snapshot taken
// under the shard's lock, the client's protobuf parse and its ChunkAssembler).
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "transport/chunking.h"

namespace ps {

// The wire bytes of a message: `head` (its other fields, serialised), then field number `field`
// holding `data` as length-delimited bytes, referenced, not copied. `owner` keeps `data` alive
// until gRPC is done with the bytes, which may be after the call ends.
grpc::ByteBuffer EncodeWithTensor(const std::string& head, int field, std::string_view data,
                                  std::shared_ptr<const void> owner);

// A received message, split: `head` holds every field but the tensor's, serialised (parse it as
// the message), and AppendTensorTo hands the tensor's bytes, still in gRPC's slices, to an
// assembler. Not thread-safe.
class TensorMessage {
 public:
  // Splits `message` around field number `field` (length-delimited, at most once). Fails with
  // INVALID_ARGUMENT on bytes that are not a well-formed message.
  static absl::StatusOr<TensorMessage> Decode(const grpc::ByteBuffer& message, int field);

  const std::string& head() const { return head_; }
  // Whether the message had the tensor field.
  bool has_tensor() const { return has_tensor_; }
  int64_t tensor_bytes() const { return tensor_size_; }
  // Appends the tensor's bytes to `assembler` (which checks and decodes them).
  absl::Status AppendTensorTo(ChunkAssembler* assembler) const;

 private:
  std::vector<grpc::Slice> slices_;
  std::string head_;
  bool has_tensor_ = false;
  size_t tensor_slice_ = 0, tensor_offset_ = 0;  // where the tensor's bytes start
  int64_t tensor_size_ = 0;
};

}  // namespace ps
