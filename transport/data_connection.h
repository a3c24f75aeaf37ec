// A client's end of the bulk data plane with one shard process (transport/data_plane.h,
// transport/data_frames.h): a push or a pull is a call made on the connection itself (PushCall,
// PullCall), its answer included, its tensor going straight from the caller's buffer or coming
// straight into it. It is one TCP connection or more (lanes, as the shard's ticket says): a
// tensor of several MiB goes as one part per lane, sent and read on each lane by a thread of its
// own.
//
// Thread-safe. Calls are sent on the first lane one at a time (a second waits for the first's
// frame and first part); pulls are read by a thread per lane, each into the place its call
// expects. Once anything fails on the connection it ends for good (ended()), and its owner opens
// another or uses gRPC.
#pragma once

#include <grpcpp/support/status.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/fill_progress.h"
#include "common/wire_type.h"
#include "transport/frame_inbox.h"
#include "transport/socket.h"
#include "transport/tls.h"

namespace ps {

class DataConnection {
 public:
  // What a shard's AttachDataPlane handed out: where and how to connect.
  struct Ticket {
    std::string host;
    int port = 0;
    uint64_t connection = 0;
    std::string secret;
    int lanes = 1;
    bool calls = false;  // whether the shard takes PushCall and PullCall frames
    // The job's TLS (a client's context), which every lane then speaks; null: plain TCP. The
    // shard's certificate must name `host`.
    std::shared_ptr<const TlsContext> tls = nullptr;
    bool last_piece_first = false;  // whether a PushCall's values may come last piece first
  };
  // Connects the ticket's lanes and presents it on each, before `deadline`; a peer that moves no
  // byte for `stall` fails the connection later. UNAVAILABLE naming the address and why (the
  // shard's refusal in its words); pulled frames larger than `max_bytes` end it.
  static absl::StatusOr<std::unique_ptr<DataConnection>> Open(const Ticket& ticket,
                                                              uint64_t max_bytes,
                                                              absl::Time deadline,
                                                              absl::Duration stall);
  // Ends the connection and joins its readers.
  ~DataConnection();

  // The id calls name it by.
  uint64_t id() const { return id_; }
  int lanes() const { return static_cast<int>(lanes_.size()); }
  bool calls() const { return calls_; }
  bool last_piece_first() const { return last_piece_first_; }
  // A transfer id not used before on this connection.
  uint64_t NextTransfer() { return next_transfer_.fetch_add(1); }

  // Makes a push on the connection itself (FrameKind::kPushCall): `header` (a serialized
  // v1::PushHeader naming this connection and `transfer`), then `values` as `type` (striped over
  // the lanes, as StripeCount says: the first part on the first lane with the call, the others
  // once the shard said Proceed), and waits for the shard's answer until `deadline`. The call's
  // status as the shard answered it, its serialized PushResponse when OK, and how many values were
  // saturated to the type's range. A failure to send (the connection is then ended), an answer that
  // does not come by `deadline` or does not parse is this function's error instead.
  struct Answered {
    grpc::Status status;
    std::string response;
    int64_t saturated = 0;
  };
  // A replica's primary makes its changes on its backup's connection so, as kChangeCall frames
  // (`header` a serialized v1::ReplicationMessage). With `filling`, `values` are still being
  // filled: each piece goes once it is in place, in `order` (SendValues; kLastPieceFirst: the
  // header says so, and the shard's ticket said it takes it), and the answer is waited for at
  // most `answer_within` after the last one went (sending took what filling took).
  absl::StatusOr<Answered> PushCall(uint64_t transfer, const std::string& header,
                                    absl::Span<const float> values, WireType type,
                                    absl::Time deadline, FrameKind kind = FrameKind::kPushCall,
                                    const FillProgress* filling = nullptr,
                                    ValuesOrder order = ValuesOrder::kInOrder,
                                    absl::Duration answer_within = absl::InfiniteDuration());
  // Makes a pull on the connection itself (FrameKind::kPullCall): `request` (a serialized
  // v1::PullRequest naming this connection and `transfer`); its values go into `dst` as `type`
  // values (striped as any pull's), and the shard's answer, its status and, when OK, the
  // serialized PullChunk that says what they are, is waited for until `deadline` (the values
  // too, once it said OK). A failure to send, an answer or values that do not come by `deadline`
  // or an answer that does not parse is this function's error instead. `dst` is not written once
  // this returned. `on_read` is told of each run of values as it is in place, on the lanes'
  // reading threads (ExpectStriped): a forward pass may start on a pull's first values.
  absl::StatusOr<Answered> PullCall(uint64_t transfer, const std::string& request,
                                    absl::Span<float> dst, WireType type, absl::Time deadline,
                                    ValuesSeen on_read = IgnoreValues);
  // The values of pulled transfer `transfer` go into `dst` as `type` values, `on_read` told of
  // each run as it is in place (ExpectStriped); Await waits for them (the same `dst` and `type`)
  // and forgets the transfer (AwaitStriped).
  absl::Status Expect(uint64_t transfer, absl::Span<float> dst, WireType type,
                      ValuesSeen on_read = IgnoreValues) {
    return ExpectStriped(inboxes_, transfer, dst, type, on_read);
  }
  absl::Status Await(uint64_t transfer, absl::Span<const float> dst, WireType type,
                     absl::Time deadline) {
    return AwaitStriped(inboxes_, transfer, dst.size(), type, deadline);
  }

  // Whether the connection ended (it failed or the shard closed it).
  bool ended() const;
  // Ends the connection: calls waiting on it fail at once (UNAVAILABLE).
  void End();

 private:
  struct Lane {
    explicit Lane(Socket s, uint64_t max_bytes)
        : socket(std::move(s)), inbox(&socket, FrameKind::kPull, max_bytes) {}
    Socket socket;
    FrameInbox inbox;
    std::thread reader;
  };
  // Sends a call's frame (kind, transfer, `request`) and, for a push, its values (`values` as
  // `type`, one part) on the first lane; returns how many values were saturated. A failure ends
  // the connection.
  absl::StatusOr<int64_t> SendCall(FrameKind kind, uint64_t transfer, const std::string& request,
                                   absl::Span<const float> values, WireType type,
                                   absl::Time deadline, const FillProgress* filling = nullptr,
                                   ValuesOrder order = ValuesOrder::kInOrder);
  // A striped push call's parts but the first (of `parts`), each on its lane, once the shard
  // said Proceed (none if it answered first); returns how many values were saturated. A failure
  // ends the connection.
  absl::StatusOr<int64_t> SendOtherParts(uint64_t transfer, absl::Span<const float> values,
                                         WireType type, int parts, absl::Time deadline);
  // The answer to call `transfer` (expected into `answer`), waited for until `deadline`.
  absl::StatusOr<grpc::Status> AwaitAnswer(uint64_t transfer, const std::string& answer,
                                           std::string* response, absl::Time deadline);
  DataConnection(std::vector<Socket> sockets, uint64_t id, uint64_t max_bytes, bool calls,
                 bool last_piece_first);

  const uint64_t id_;
  const bool calls_;
  const bool last_piece_first_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  std::vector<FrameInbox*> inboxes_;
  std::mutex send_mu_;    // the first lane: one call (its frame and first part) at a time
  std::mutex others_mu_;  // the other lanes: one striped push's other parts at a time
  std::atomic<uint64_t> next_transfer_{1};
};

}  // namespace ps
