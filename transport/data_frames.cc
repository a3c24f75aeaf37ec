#include "transport/data_frames.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "transport/chunking.h"

namespace ps {
namespace {

constexpr uint32_t kMagic = 0x31445350;  // "PSD1" as little-endian bytes
constexpr size_t kHeaderBytes = 24;

void Put(char* at, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) at[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint64_t Get(const char* at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(at[i])) << (8 * i);
  return v;
}

void EncodeHeader(FrameHeader h, char* out) {
  Put(out, kMagic, 4);
  Put(out + 4, static_cast<uint32_t>(h.kind), 4);
  Put(out + 8, h.transfer, 8);
  Put(out + 16, h.bytes, 8);
}

}  // namespace

std::string RandomSecret() {
  std::random_device random;  // the system's source (getrandom)
  std::string secret(kSecretBytes, '\0');
  for (size_t i = 0; i < kSecretBytes; i += 4) Put(&secret[i], random(), 4);
  return secret;
}

uint64_t RandomId() {
  std::random_device random;
  uint64_t id = 0;
  while (id == 0) id = (static_cast<uint64_t>(random()) << 32) | random();
  return id;
}

std::string HelloPayload(const std::string& secret, int lane) {
  std::string payload = secret;
  payload.resize(kHelloBytes);
  Put(&payload[kSecretBytes], static_cast<uint32_t>(lane), 4);
  return payload;
}

int HelloLane(const std::string& payload, std::string* secret) {
  *secret = payload.substr(0, kSecretBytes);
  return static_cast<int>(Get(payload.data() + kSecretBytes, 4) & 0x7fffffff);
}

std::string EncodeCall(const CallFrame& call) {
  std::string payload(8, '\0');
  Put(payload.data(),
      static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Microseconds(call.timeout))), 8);
  payload += call.request;
  return payload;
}

absl::StatusOr<CallFrame> DecodeCall(std::string_view payload) {
  if (payload.size() < 8 || payload.size() > kMaxCallBytes) {
    return absl::DataLossError(absl::StrCat("a call of ", payload.size(), " bytes"));
  }
  const uint64_t micros = std::min<uint64_t>(Get(payload.data(), 8), uint64_t{1} << 40);
  return CallFrame{absl::Microseconds(static_cast<int64_t>(micros)),
                   std::string(payload.substr(8))};
}

std::string EncodeAnswer(const grpc::Status& status, std::string_view response) {
  const std::string message = status.error_message().substr(0, kMaxAnswerMessage);
  // Details are a short marker (transport/grpc_status.h); a long one would not fit an answer.
  const std::string details =
      status.error_details().size() <= kMaxAnswerMessage ? status.error_details() : "";
  std::string payload(12, '\0');
  Put(payload.data(), static_cast<uint32_t>(status.error_code()), 4);
  Put(payload.data() + 4, message.size(), 4);
  Put(payload.data() + 8, details.size(), 4);
  payload += message;
  payload += details;
  if (status.ok()) payload += response;
  return payload;
}

absl::StatusOr<grpc::Status> DecodeAnswer(std::string_view payload, std::string* response) {
  if (payload.size() < 12) return absl::DataLossError("a data-plane answer too short");
  const uint64_t code = Get(payload.data(), 4), message = Get(payload.data() + 4, 4),
                 details = Get(payload.data() + 8, 4);
  if (code > grpc::StatusCode::UNAUTHENTICATED || message + details > payload.size() - 12) {
    return absl::DataLossError("a malformed data-plane answer");
  }
  *response = std::string(payload.substr(12 + message + details));
  if (code == grpc::StatusCode::OK) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(code), std::string(payload.substr(12, message)),
                      std::string(payload.substr(12 + message, details)));
}

int StripeCount(size_t values, WireType type, int lanes) {
  const uint64_t bytes = static_cast<uint64_t>(values) * WireBytes(type);
  return static_cast<int>(std::clamp<uint64_t>(bytes / kMinStripeBytes, 1, std::max(lanes, 1)));
}

Stripe StripeOf(size_t values, int parts, int part) {
  const size_t units = (values + kStripeAlign - 1) / kStripeAlign;  // the last may be short
  const size_t base = units / parts, extra = units % parts, p = static_cast<size_t>(part);
  const size_t begin = std::min(values, (p * base + std::min(p, extra)) * kStripeAlign);
  const size_t end = std::min(values, begin + (base + (p < extra ? 1 : 0)) * kStripeAlign);
  return {begin, end - begin};
}

absl::Status SendFrame(Socket& socket, FrameHeader header, std::string_view payload,
                       absl::Time deadline) {
  char head[kHeaderBytes];
  header.bytes = payload.size();
  EncodeHeader(header, head);
  iovec pieces[2] = {{head, kHeaderBytes}, {const_cast<char*>(payload.data()), payload.size()}};
  return socket.Send(absl::MakeConstSpan(pieces, payload.empty() ? 1 : 2), deadline);
}

absl::StatusOr<FrameHeader> ReceiveHeader(Socket& socket, absl::Time deadline) {
  char head[kHeaderBytes];
  if (absl::Status s = socket.Receive(head, kHeaderBytes, deadline); !s.ok()) return s;
  const uint32_t kind = static_cast<uint32_t>(Get(head + 4, 4));
  if (Get(head, 4) != kMagic || kind < 1 || kind > static_cast<uint32_t>(FrameKind::kProceed)) {
    return absl::DataLossError("not a data-plane frame (a peer of another kind or version)");
  }
  return FrameHeader{static_cast<FrameKind>(kind), Get(head + 8, 8), Get(head + 16, 8)};
}

namespace {

// Waits until `filling` has `n` values in place (or all it will have: stopped), for kMaxFillWait
// at most, and no longer once `socket` is shut down (its peer cut it: nothing more can go).
// Returns how many are in place; StoppedComing tells why when fewer.
int64_t AwaitFill(const Socket& socket, const FillProgress& filling, int64_t n) {
  const absl::Time give_up = absl::Now() + kMaxFillWait;
  const int64_t want = std::min(n, filling.total());
  for (;;) {
    const int64_t in = filling.WaitFor(n, std::min(give_up, absl::Now() + absl::Milliseconds(100)));
    if (in >= want || filling.stopped() || socket.shut_down() || absl::Now() >= give_up) return in;
  }
}
absl::Status StoppedComing(const Socket& socket, int64_t sent, int64_t n) {
  if (socket.shut_down()) {
    return absl::UnavailableError(
        absl::StrCat("the connection ended while the values were coming, after ", sent, " of ", n));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("the values to send stopped coming after ", sent, " of ", n));
}

// SendValues in kLastPieceFirst order (float32).
absl::Status SendLastPieceFirst(Socket& socket, absl::Span<const float> values, absl::Time deadline,
                                const FillProgress* filling) {
  const int64_t n = static_cast<int64_t>(values.size());
  for (int64_t begin = n == 0 ? 0 : (n - 1) / kFillPiece * kFillPiece; begin >= 0 && n > 0;
       begin -= kFillPiece) {
    const int64_t end = std::min(n, begin + kFillPiece);
    if (filling != nullptr && AwaitFill(socket, *filling, n - begin) < n - begin) {
      return StoppedComing(socket, n - end, n);
    }
    std::string_view bytes = AsBytes(values.subspan(begin, end - begin));
    if (absl::Status s = socket.Send(bytes.data(), bytes.size(), deadline); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> SendValues(Socket& socket, FrameKind kind, uint64_t transfer,
                                   absl::Span<const float> values, WireType type,
                                   absl::Time deadline, const FillProgress* filling,
                                   int64_t filled_from, ValuesOrder order) {
  if (order == ValuesOrder::kLastPieceFirst && (type != WireType::kFloat32 || filled_from != 0)) {
    return absl::InvalidArgumentError("values go last piece first as float32 only, from 0");
  }
  char head[kHeaderBytes];
  EncodeHeader({kind, transfer, static_cast<uint64_t>(values.size()) * WireBytes(type)}, head);
  if (order == ValuesOrder::kLastPieceFirst) {
    if (absl::Status s = socket.Send(head, kHeaderBytes, deadline); !s.ok()) return s;
    if (absl::Status s = SendLastPieceFirst(socket, values, deadline, filling); !s.ok()) return s;
    return 0;
  }
  if (type == WireType::kFloat32 && filling == nullptr) {
    std::string_view bytes = AsBytes(values);
    iovec pieces[2] = {{head, kHeaderBytes}, {const_cast<char*>(bytes.data()), bytes.size()}};
    absl::Status s = socket.Send(absl::MakeConstSpan(pieces, 2), deadline);
    if (!s.ok()) return s;
    return 0;
  }
  if (absl::Status s = socket.Send(head, kHeaderBytes, deadline); !s.ok()) return s;
  int64_t saturated = 0;
  std::string piece;
  for (size_t sent = 0; sent < values.size();) {
    size_t ready = values.size();
    if (filling != nullptr) {  // a piece more at least, or the rest
      const int64_t in_place = AwaitFill(socket, *filling, filled_from + sent + kFillPiece);
      ready = std::min<size_t>(ready, std::max<int64_t>(in_place - filled_from, 0));
      if (ready <= sent) {
        return StoppedComing(socket, static_cast<int64_t>(sent),
                             static_cast<int64_t>(values.size()));
      }
    }
    absl::Span<const float> part = values.subspan(sent, ready - sent);
    if (type == WireType::kFloat32) {
      std::string_view bytes = AsBytes(part);
      if (absl::Status s = socket.Send(bytes.data(), bytes.size(), deadline); !s.ok()) return s;
    } else {
      for (size_t i = 0; i < part.size(); i += kChunkFloats) {
        saturated += EncodeValues(part.subspan(i, kChunkFloats), type, &piece);
        if (absl::Status s = socket.Send(piece.data(), piece.size(), deadline); !s.ok()) return s;
      }
    }
    sent = ready;
  }
  return saturated;
}

absl::Status ReceiveValues(Socket& socket, uint64_t bytes, absl::Span<float> dst, WireType type,
                           absl::Time deadline, ValuesSeen seen, ValuesOrder order) {
  const uint64_t expected = static_cast<uint64_t>(dst.size()) * WireBytes(type);
  if (bytes != expected || (order == ValuesOrder::kLastPieceFirst && type != WireType::kFloat32)) {
    absl::Status dropped = Discard(socket, bytes, deadline);
    if (!dropped.ok()) return dropped;
    if (bytes == expected) {
      return absl::InvalidArgumentError("values come last piece first as float32 only");
    }
    return absl::InvalidArgumentError(absl::StrCat("a data-plane tensor of ", bytes,
                                                   " bytes where the call declared ", expected));
  }
  if (type == WireType::kFloat32) {  // in runs small enough to be scanned while in the cache
    constexpr uint64_t kRunValues = kSeenRunBytes / sizeof(float);
    static_assert(kFillPiece % kRunValues == 0, "a piece is whole runs");
    auto receive = [&](uint64_t begin, uint64_t end) -> absl::Status {
      for (uint64_t i = begin; i < end; i += kRunValues) {
        absl::Span<float> run = dst.subspan(i, std::min(kRunValues, end - i));
        if (absl::Status s = socket.Receive(run.data(), run.size() * sizeof(float), deadline);
            !s.ok()) {
          return s;
        }
        seen(run);
      }
      return absl::OkStatus();
    };
    if (order == ValuesOrder::kInOrder) return receive(0, dst.size());
    const uint64_t n = dst.size(), piece = kFillPiece;
    for (uint64_t begin = n == 0 ? 0 : (n - 1) / piece * piece; n > 0; begin -= piece) {
      if (absl::Status s = receive(begin, std::min(n, begin + piece)); !s.ok()) return s;
      if (begin == 0) break;
    }
    return absl::OkStatus();
  }
  ChunkAssembler assembler(dst, type);
  std::vector<char> piece(kSeenRunBytes);
  for (uint64_t left = bytes; left > 0;) {
    const size_t n = std::min<uint64_t>(left, piece.size());
    if (absl::Status s = socket.Receive(piece.data(), n, deadline); !s.ok()) return s;
    const int64_t before = assembler.received();
    if (absl::Status s = assembler.Append(std::string_view(piece.data(), n)); !s.ok()) return s;
    seen(absl::Span<const float>(dst).subspan(before, assembler.received() - before));
    left -= n;
  }
  return assembler.Finish();
}

absl::Status Discard(Socket& socket, uint64_t bytes, absl::Time deadline) {
  std::vector<char> sink(std::min<uint64_t>(bytes, kChunkBytes));
  for (uint64_t left = bytes; left > 0;) {
    const size_t n = std::min<uint64_t>(left, sink.size());
    if (absl::Status s = socket.Receive(sink.data(), n, deadline); !s.ok()) return s;
    left -= n;
  }
  return absl::OkStatus();
}

}  // namespace ps
