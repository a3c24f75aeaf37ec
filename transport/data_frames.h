// The bulk data plane's wire format: what a client and a shard send each other on the TCP
// connection that carries tensor bytes (transport/data_plane.h, transport/data_connection.h). A
// push or a pull is a call made on the connection itself, answered on it; the call, not the
// connection, is authorised, checked, applied once and answered.
//
// A client's connection with a shard is one or more TCP connections, its lanes (as many as
// AttachDataPlane says): a large tensor goes as one frame per lane, each a contiguous part of it
// (Stripe), so that several threads on each end move its bytes at once; a small one goes whole on
// the first lane.
//
// Every frame is a 24-byte header, little-endian: magic "PSD1", kind, transfer, bytes; then
// `bytes` bytes of payload.
//   Hello    client -> shard, first on each lane: transfer = the connection id, payload = the
//            16-byte secret (both from AttachDataPlane, one use each lane) and the lane's index
//            (4 bytes).
//   Welcome  shard -> client: the connection is the client's; no payload.
//   Refused  shard -> client, then the shard closes: payload = why, in words (< 1 KiB).
//   PushCall client -> shard, on the first lane: a Push: payload = the call's timeout (8 bytes,
//            microseconds) and its PushHeader (proto/ps.proto), serialized. Its tensor's first
//            part follows at once as the Push frame of the same transfer on the same lane. A
//            tensor striped over several lanes (StripeCount) has its other parts sent once the
//            shard said Proceed, each as the Push frame of the transfer on its own lane.
//   Proceed  shard -> client, on the first lane: the striped push call `transfer` was let in and
//            its other parts are expected now; no payload. A call refused first is answered
//            instead (its other parts are never sent).
//   Push     client -> shard: (a part of) the tensor of the push call `transfer`.
//   PullCall client -> shard, on the first lane: a Pull: payload = its timeout and its
//            PullRequest, serialized. The shard sends the values as the Pull frame(s) of the
//            same transfer (striped as any large tensor), then the Answer.
//   Pull     shard -> client: (a part of) the tensor of the pull call `transfer`.
//   ChangeCall a replica's primary -> its backup, on the first lane of the connection the backup's
//            ticket opened (server/replication/replica.h): a change of the shard, as a PushCall
//            with a ReplicationMessage (epoch and ChangeHeader) for request; its values follow
//            whole as the Push frame of the same transfer, and it is answered once applied.
//   Answer   shard -> client, on the first lane: how the call `transfer` names ended: its status
//            (code 4 bytes; message and details each 4 bytes of length and the bytes) and, when
//            OK, its answer serialized: a PushResponse, or the PullChunk that heads a gRPC
//            answer (version, offset, dtype, data_values).
// A tensor's payload is its values as the call's wire type (common/wire_type.h), in order.
// Anything else (a bad magic, an unknown kind, a payload larger than allowed) ends the
// connection.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/fill_progress.h"
#include "common/wire_type.h"
#include "transport/socket.h"

namespace ps {

enum class FrameKind : uint32_t {
  kHello = 1,
  kWelcome = 2,
  kRefused = 3,
  kPush = 4,
  kPull = 5,
  kPushCall = 6,
  kAnswer = 7,
  kPullCall = 8,
  kChangeCall = 9,
  kProceed = 10,
};

struct FrameHeader {
  FrameKind kind;
  uint64_t transfer = 0;
  uint64_t bytes = 0;
};

inline constexpr size_t kSecretBytes = 16;
inline constexpr uint64_t kHelloBytes = kSecretBytes + 4;
inline constexpr uint64_t kMaxRefusalBytes = 1024;

// A hello's payload, and the lane it names (with the secret in `secret`).
std::string HelloPayload(const std::string& secret, int lane);
int HelloLane(const std::string& payload, std::string* secret);

// A PushCall's or PullCall's payload, and an Answer's (a status's message is cut to
// kMaxAnswerMessage bytes).
// DecodeCall and DecodeAnswer: DATA_LOSS for a payload that is not one.
inline constexpr uint64_t kMaxCallBytes = 4096;
inline constexpr uint64_t kMaxAnswerBytes = 4096;
inline constexpr size_t kMaxAnswerMessage = 2048;
struct CallFrame {
  absl::Duration timeout;
  std::string request;  // a serialized v1::PushHeader or v1::PullRequest
};
std::string EncodeCall(const CallFrame& call);
absl::StatusOr<CallFrame> DecodeCall(std::string_view payload);
std::string EncodeAnswer(const grpc::Status& status, std::string_view response);
absl::StatusOr<grpc::Status> DecodeAnswer(std::string_view payload, std::string* response);

// The lanes a tensor of `values` values as `type` goes over, of a connection's `lanes`: one per
// kMinStripeBytes of it at most, at least one.
inline constexpr uint64_t kMinStripeBytes = 4 << 20;
int StripeCount(size_t values, WireType type, int lanes);
// Part `part` of `parts` of a tensor of `values` values: contiguous, in order, each starting on
// a multiple of kStripeAlign values (where a shard's GradientScan block starts), as even as whole
// units of kStripeAlign allow.
inline constexpr size_t kStripeAlign = size_t{1} << 16;
// The most lanes a connection has.
inline constexpr int kMaxLanes = 8;
struct Stripe {
  size_t offset = 0;
  size_t size = 0;
};
Stripe StripeOf(size_t values, int parts, int part);

// A random secret, and a random nonzero id (from the system's random source).
std::string RandomSecret();
uint64_t RandomId();

// Sends a header and `payload`.
absl::Status SendFrame(Socket& socket, FrameHeader header, std::string_view payload,
                       absl::Time deadline);
// Receives a header. DATA_LOSS for one that is not a data-plane frame; fails as Socket does.
absl::StatusOr<FrameHeader> ReceiveHeader(Socket& socket, absl::Time deadline);

// The order of a frame's values: kInOrder, or kLastPieceFirst: pieces of kFillPiece values
// (counted from the first value), the last piece first, each piece's values in order. A push
// goes so while a backward pass fills its gradient, the last layers first (float32 only; each
// piece is whole GradientScan blocks, which a shard may scan in any order).
enum class ValuesOrder { kInOrder, kLastPieceFirst };

// Sends `values` as `type` in one frame of `kind`, in `order`; returns how many values were
// saturated to the type's range. 32-bit values go straight from `values`; others are encoded a
// piece at a time. With `filling`, `values` (the ones from `filled_from` on of the buffer it tells
// of) are still being filled: each piece is sent once it is in place (DEADLINE_EXCEEDED if no more
// comes within kMaxFillWait, UNAVAILABLE as soon as the socket is shut down meanwhile: its peer
// cut it, or its reader saw it end); in kLastPieceFirst order `filling` counts the values in
// place from the end (and `filled_from` is 0). INVALID_ARGUMENT for kLastPieceFirst with another
// type.
absl::StatusOr<int64_t> SendValues(Socket& socket, FrameKind kind, uint64_t transfer,
                                   absl::Span<const float> values, WireType type,
                                   absl::Time deadline, const FillProgress* filling = nullptr,
                                   int64_t filled_from = 0,
                                   ValuesOrder order = ValuesOrder::kInOrder);
// How long SendValues waits for the next piece of values being filled: a copy in memory, a push
// forwarded to a replica as it comes (server/replication/replica.h), or a gradient as backward
// makes it: longer than a data plane's stall (10 s), so that a push whose worker stalls fails
// there first and its stage is padded out, not failed.
inline constexpr absl::Duration kMaxFillWait = absl::Seconds(30);
// How long a call's values sent as they are made (ValuesOrder::kLastPieceFirst: a gradient as
// backward makes it) may take to come in all: a backward pass's time. Each piece still comes
// within the connection's stall (10 s) of the last.
inline constexpr absl::Duration kMaxStreamedValues = absl::Minutes(10);
// The bytes of a run ValuesSeen is told of (the last may be shorter): a quarter of a usual L2.
inline constexpr uint64_t kSeenRunBytes = 256 << 10;
// Called with each run of a tensor's values as soon as it is in the destination (decoded), each
// value once, in order within each part of a striped tensor (its parts on threads of their own,
// at once): a shard scans a gradient while the rest is on its way.
using ValuesSeen = absl::FunctionRef<void(absl::Span<const float>)>;
inline void IgnoreValues(absl::Span<const float>) {}

// Receives a frame's payload of `bytes` bytes, sent in `order`, into `dst` as `type` values
// (32-bit ones straight into `dst`), telling `seen` of each run of them. The payload is read whole
// even when it does not fit `dst` (INVALID_ARGUMENT then, naming both sizes, `seen` not called),
// or comes in kLastPieceFirst order but not as float32, so that the connection stays usable; other
// failures are the socket's.
absl::Status ReceiveValues(Socket& socket, uint64_t bytes, absl::Span<float> dst, WireType type,
                           absl::Time deadline, ValuesSeen seen = IgnoreValues,
                           ValuesOrder order = ValuesOrder::kInOrder);
// Reads and drops `bytes` bytes of payload.
absl::Status Discard(Socket& socket, uint64_t bytes, absl::Time deadline);

}  // namespace ps
