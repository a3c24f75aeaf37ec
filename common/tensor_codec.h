// Messages carrying a tensor, built for gRPC without copying the tensor: the message's other
// fields are serialised as usual, and the tensor's bytes become the last field of the message as a
// gRPC slice that references the caller's memory (the way TensorFlow's grpc_tensor_coding shares
// a tensor's backing store). Protobuf parses the result like any other message (field order does
// not matter on the wire).
//
// Copies of a pulled tensor on its way from the shard's values to the worker's buffer: the
// snapshot taken under the shard's lock, then (after the kernel's) the client's protobuf parse and
// its ChunkAssembler: 3 (a 16-bit pull adds its conversion, which replaces no copy).
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <memory>
#include <string>
#include <string_view>

namespace ps {

// The wire bytes of a message: `head` (its other fields, serialised), then field number `field`
// holding `data` as length-delimited bytes, referenced, not copied. `owner` keeps `data` alive
// until gRPC is done with the bytes, which may be after the call ends.
grpc::ByteBuffer EncodeWithTensor(const std::string& head, int field, std::string_view data,
                                  std::shared_ptr<const void> owner);

}  // namespace ps
