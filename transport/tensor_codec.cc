#include "transport/tensor_codec.h"

#include <algorithm>
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

namespace {

// Reads a message's bytes across gRPC's slices.
class SliceReader {
 public:
  explicit SliceReader(const std::vector<grpc::Slice>& slices) : slices_(slices) { Skip(); }
  bool done() const { return slice_ == slices_.size(); }
  size_t slice() const { return slice_; }
  size_t offset() const { return offset_; }

  bool Byte(uint8_t* b) {
    if (done()) return false;
    *b = slices_[slice_].begin()[offset_++];
    Skip();
    return true;
  }
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  // Calls fn(piece) for the next n bytes, contiguous piece by piece; false if fewer remain.
  template <typename Fn>
  bool Bytes(uint64_t n, Fn fn) {
    while (n > 0) {
      if (done()) return false;
      const grpc::Slice& s = slices_[slice_];
      const size_t take = std::min<uint64_t>(n, s.size() - offset_);
      fn(std::string_view(reinterpret_cast<const char*>(s.begin()) + offset_, take));
      offset_ += take;
      n -= take;
      Skip();
    }
    return true;
  }

 private:
  void Skip() {  // past the end of the current slice (and empty ones)
    while (slice_ < slices_.size() && offset_ == slices_[slice_].size()) {
      ++slice_;
      offset_ = 0;
    }
  }
  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0, offset_ = 0;
};

absl::Status Malformed() {
  return absl::InvalidArgumentError("the message's bytes are not a well-formed message");
}

}  // namespace

absl::StatusOr<TensorMessage> TensorMessage::Decode(const grpc::ByteBuffer& message, int field) {
  TensorMessage m;
  if (!message.Dump(&m.slices_).ok()) return Malformed();
  SliceReader in(m.slices_);
  while (!in.done()) {
    uint64_t tag = 0, value = 0;
    if (!in.Varint(&tag) || (tag >> 3) == 0) return Malformed();
    const int wire_type = static_cast<int>(tag & 7);
    if (static_cast<int64_t>(tag >> 3) == field) {
      if (wire_type != 2 || m.has_tensor_ || !in.Varint(&value)) return Malformed();
      m.has_tensor_ = true;
      m.tensor_slice_ = in.slice();
      m.tensor_offset_ = in.offset();
      m.tensor_size_ = static_cast<int64_t>(value);
      if (!in.Bytes(value, [](std::string_view) {})) return Malformed();
      continue;
    }
    AppendVarint(tag, &m.head_);
    auto copy = [&](std::string_view piece) { m.head_.append(piece); };
    switch (wire_type) {
      case 0:
        if (!in.Varint(&value)) return Malformed();
        AppendVarint(value, &m.head_);
        break;
      case 1:
      case 5:
        if (!in.Bytes(wire_type == 1 ? 8 : 4, copy)) return Malformed();
        break;
      case 2:
        if (!in.Varint(&value)) return Malformed();
        AppendVarint(value, &m.head_);
        if (!in.Bytes(value, copy)) return Malformed();
        break;
      default:  // groups (3, 4) and unknown wire types
        return Malformed();
    }
  }
  return m;
}

absl::Status TensorMessage::AppendTensorTo(ChunkAssembler* assembler) const {
  if (!has_tensor_) return absl::OkStatus();
  // Appended a slice at a time; an element split between two slices is put together first.
  std::string carry;
  const size_t width = assembler->element_bytes();
  int64_t left = tensor_size_;
  size_t offset = tensor_offset_;
  for (size_t i = tensor_slice_; left > 0 && i < slices_.size(); ++i, offset = 0) {
    std::string_view piece(reinterpret_cast<const char*>(slices_[i].begin()) + offset,
                           std::min<int64_t>(left, slices_[i].size() - offset));
    left -= static_cast<int64_t>(piece.size());
    if (!carry.empty()) {
      const size_t need = std::min(width - carry.size(), piece.size());
      carry.append(piece.substr(0, need));
      piece.remove_prefix(need);
      if (carry.size() == width || left == 0) {
        if (absl::Status s = assembler->Append(carry); !s.ok()) return s;
        carry.clear();
      }
    }
    const size_t whole = piece.size() - piece.size() % width;
    if (whole > 0) {
      if (absl::Status s = assembler->Append(piece.substr(0, whole)); !s.ok()) return s;
    }
    carry.append(piece.substr(whole));
    if (left == 0 && !carry.empty()) return assembler->Append(carry);  // a partial value: refused
  }
  return absl::OkStatus();
}

}  // namespace ps
