#include "common/tensor_codec.h"

#include <cstdint>

namespace ps {
namespace {

void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Called by gRPC when it drops the last reference to a tensor slice.
void ReleaseOwner(void* owner) { delete static_cast<std::shared_ptr<const void>*>(owner); }

}  // namespace

grpc::ByteBuffer EncodeWithTensor(const std::string& head, int field, std::string_view data,
                                  std::shared_ptr<const void> owner) {
  std::string prefix = head;
  AppendVarint((static_cast<uint64_t>(field) << 3) | 2, &prefix);  // wire type 2: length-delimited
  AppendVarint(data.size(), &prefix);
  grpc::Slice slices[2] = {grpc::Slice(prefix), grpc::Slice()};
  int count = 1;
  if (!data.empty()) {
    slices[1] = grpc::Slice(const_cast<char*>(data.data()), data.size(), &ReleaseOwner,
                            new std::shared_ptr<const void>(std::move(owner)));
    count = 2;
  }
  return grpc::ByteBuffer(slices, count);
}

}  // namespace ps
