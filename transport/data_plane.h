// The shard's end of the bulk data plane (transport/data_frames.h): Push and Pull calls made on a
// TCP connection of the client's own (TLS when the job uses TLS), their tensors with them. gRPC
// streams stop near half of what a TCP connection carries (bench/RESULTS.md); here a tensor goes
// as one frame, from the caller's buffer and into the shard's, with no copy in user space for
// float32.
//
// A client asks for a ticket over gRPC (AttachDataPlane, authorised like any call as the worker
// it names), connects `lanes` times to port() and presents it on each: a ticket opens one
// connection, once, within `hello` of being issued, and makes it that worker's (a worker's newer
// connection replaces its older one), carrying what the worker's token proved (its Credential),
// by which the shard admits the calls made on it as it admits the same calls over gRPC. Calls
// (PushCall, PullCall frames) go to the shard's handlers (TakeCalls) and are answered on the
// connection. A tensor of several MiB is striped over the lanes (transport/data_frames.h), each
// part read and sent by a thread of its own: a pull's values as it sends them (Send), a push's
// other parts once its handler, reading the first, told the client to send them (Proceed); a
// frame no call waits for is read and dropped. The server may keep owners of its own
// (ReservedOwner, of the kinds Options::owner_kinds names: a backup replica's primary makes its
// changes so, ChangeCall, on connections the backup gave it tickets for).
//
// Every wait has an end: a hello within `hello`, a frame's bytes moving at least every `stall`.
// Anything unexpected on a connection (a bad frame, a stalled peer, a call that gave up
// mid-tensor) ends that connection only (all its lanes); its client sends over gRPC meanwhile.
// Places are kept per credential, so that no caller shuts out the workers: each worker (and
// reserved owner) holds at most one ticket and one connection, observers kMaxObserverConnections
// between them, and all of them at most `max_connections` (two threads a lane). A socket that has
// not shown a ticket yet holds none of those places: such sockets share kMaxSayingHello places,
// the oldest closed to make room for the next. No buffer is allocated for a frame: it goes into
// its call's buffer or is dropped a piece at a time. Thread-safe.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/log.h"
#include "common/wire_type.h"
#include "transport/data_frames.h"
#include "transport/security.h"
#include "transport/socket.h"
#include "transport/tls.h"

namespace ps {

// What the token a data-plane ticket was asked with proved (AttachDataPlane): which worker's
// places the calls made on its connection take and what they may do (ShardService admits them
// by it). The default is a caller of a job without tokens.
struct DataPlaneCredential {
  Caller caller{Caller::kAnyWorker};
  Access access = Access::kWrite;
};

class DataPlane {
 public:
  // Lanes a connection may have at most, and the default: one per 4 CPUs this process may use,
  // 1 to 4 (on the 16-core GPU machine 4 lanes moved a 38 MiB push 1.2-2x as fast as 1, 2 lanes
  // 1.1-1.6x; bench/RESULTS.md). 1 on a 2-core machine, where more only contend.
  static constexpr int kMaxLanes = ps::kMaxLanes;
  static int AutoLanes();

  // A kind of the owners the server keeps for itself (ReservedOwner): `count` of them from
  // `first`, called `who` in messages, whose sockets may stall for `stall` (zero: Options::stall),
  // and whose connections end saying `released` when Release ends them.
  struct OwnerKind {
    int first = 0;
    int count = 1;
    std::string who;
    absl::Duration stall = absl::ZeroDuration();
    std::string released;
  };
  struct Options {
    std::string host = "127.0.0.1";
    int port = 0;  // 0: a free one
    int max_connections = 64;
    int lanes = 1;                 // TCP connections per client connection
    uint64_t max_frame_bytes = 0;  // the largest tensor (the shard's range as float32)
    absl::Duration hello = absl::Seconds(5);
    absl::Duration stall = absl::Seconds(10);
    // The job's TLS (a server's context): every lane's handshake comes before its hello, within
    // `hello`. Null: plain TCP.
    std::shared_ptr<const TlsContext> tls;
    // The kinds of the reserved owners the server uses, each within them.
    std::vector<OwnerKind> owner_kinds;
  };
  // Listens (UNAVAILABLE naming host:port and why if it cannot) and starts accepting;
  // INVALID_ARGUMENT for an owner kind not within the reserved owners.
  static absl::StatusOr<std::unique_ptr<DataPlane>> Start(Options options);
  // Stops accepting and ends every connection: calls waiting on one fail, later ones are refused
  // (FAILED_PRECONDITION). For a shard shutting down, before its calls are cancelled.
  void Stop();
  // Stops and joins the threads.
  ~DataPlane();
  int port() const;

  struct Ticket {
    uint64_t connection = 0;
    std::string secret;
    int lanes = 1;
  };
  // Owners the server keeps for connections of its own, which carry nothing of a worker's or an
  // observer's (a client asking for a ticket as one is refused): kMaxReservedOwners of them from
  // kFirstReservedOwner, of the kinds Options::owner_kinds names.
  static constexpr int kFirstReservedOwner = std::numeric_limits<int>::min();
  static constexpr int kMaxReservedOwners = 17;
  static bool ReservedOwner(int owner) {
    return owner >= kFirstReservedOwner && owner < kFirstReservedOwner + kMaxReservedOwners;
  }
  static bool ObserverOwner(int owner) { return owner < 0 && !ReservedOwner(owner); }
  // Connections and unused tickets that observers hold at most, all of them together: a
  // read-only token cannot take the workers' places.
  static constexpr int kMaxObserverConnections = 4;
  // Sockets accepted that have not shown a valid ticket yet (TLS handshake, hello), at most.
  static constexpr int kMaxSayingHello = 32;

  using Credential = DataPlaneCredential;
  // A ticket for worker `owner` (negative: an observer; or a reserved owner) whose token proved
  // `credential`. A worker's (or a reserved owner's) new ticket replaces its unused older one, and
  // its connection, once open, the older one. RESOURCE_EXHAUSTED when observers already hold
  // kMaxObserverConnections (for an observer's), or when as many clients as `max_connections`
  // hold connections or tickets (a worker counts once).
  absl::StatusOr<Ticket> Issue(int owner, Credential credential = {});

  // Called once the values of a Send are written (the number saturated to the wire type's range)
  // or could not be (UNAVAILABLE: the connection ended).
  using Sent = absl::AnyInvocable<void(absl::StatusOr<int64_t>)>;
  // Sends `values` as `type` on connection `connection` as transfer `transfer`, on the
  // connection's own threads (one a lane), and then calls `sent` on one of them. The values must
  // be out by `deadline` (the call's: past it the client no longer waits for them) and within
  // kMaxSend, or the send fails and ends the connection, so that a client reading slowly holds a
  // lane and the values that long at most. With `filling`, `values` are still being filled: each
  // piece goes once it is in place (SendValues). `values` and `filling` must stay alive until
  // `sent` is called: `keep` is held until then for that (or the caller keeps them itself).
  // FAILED_PRECONDITION at once, `sent` not called, when the connection is not `owner`'s or no
  // longer open.
  static constexpr absl::Duration kMaxSend = absl::Minutes(10);
  absl::Status Send(uint64_t connection, int owner, uint64_t transfer,
                    std::shared_ptr<const void> keep, absl::Span<const float> values, WireType type,
                    Sent sent, absl::Time deadline, const FillProgress* filling = nullptr);

  // A call made on a connection itself (FrameKind::kPushCall, kPullCall): the connection, the
  // call's transfer, the connection's owner and credential, when it must be answered by, and its
  // request (a serialized v1::PushHeader or v1::PullRequest, not looked at here).
  struct Call {
    uint64_t connection = 0, transfer = 0;
    int owner = 0;
    Credential credential;
    absl::Time deadline;
    std::string request;
  };
  // How a call ended: its status and, when OK, its serialized answer (a v1::PushResponse, or the
  // v1::PullChunk that heads a gRPC Pull's answer).
  struct CallAnswer {
    grpc::Status status;
    std::string response;
  };
  // A push's tensor is still on the lane: `read_values` reads it, sent in the order given, into
  // the call's buffer (FrameInbox::ReadCallValues; at most once: one not read is dropped). It is
  // answered with what the handler returns.
  using ReadValues =
      absl::FunctionRef<absl::Status(absl::Span<float>, WireType, ValuesSeen, ValuesOrder)>;
  using PushHandler = std::function<CallAnswer(const Call&, ReadValues read_values)>;
  // A pull is answered by calling `answer` once, from any thread, once its values were sent
  // (Send, as the call's transfer) or could not be.
  using Answer = absl::AnyInvocable<void(CallAnswer)>;
  using PullHandler = std::function<void(const Call&, Answer answer)>;
  // A change (ChangeCall) is handled as a push is: its values follow on the lane. `ended` is told
  // of each connection that was open once it ended (a pull it made that is still held can go).
  struct CallHandlers {
    PushHandler push;
    PullHandler pull;
    PushHandler change;
    std::function<void(uint64_t connection)> ended;
  };
  // From now on calls made on a connection go to `handlers`, on the connection's first lane's
  // reading thread (one at a time a connection; a pull may be answered later, from any thread),
  // and are answered on that lane. Without handlers (the default) they are answered "data plane
  // lost" (the client makes them over gRPC), once every call in progress was answered: for an
  // owner going away.
  void TakeCalls(CallHandlers handlers);

  // Ends worker `owner`'s connection, saying `why` (it left, its lease expired; a reserved
  // owner's say what their kind says), and forgets its unused tickets.
  void Release(int owner, absl::string_view why = "the worker left");
  // Connections open now.
  int connections() const;

 private:
  class Lane;
  struct Connection;
  DataPlane(Options options, std::unique_ptr<Listener> listener);
  // Accepts TCP connections (each a lane served by Serve on a thread of its own) and joins those
  // that ended.
  void AcceptLoop();
  // A lane's reading thread: its hello (Admit), the rest of its connection's lanes, then its Push
  // frames until the connection ends.
  void Serve(std::shared_ptr<Lane> lane);
  // Reads a lane's hello and answers it: its connection (Welcome sent, the lane in its place; the
  // connection open once all its lanes are) or why not (Refused sent).
  absl::StatusOr<std::shared_ptr<Connection>> Admit(const std::shared_ptr<Lane>& lane);
  // Waits until all of `connection`'s lanes said hello, or `deadline` (`hello` after this lane's
  // own; the connection is then closed).
  absl::Status AwaitLanes(Connection& connection, absl::Time expires);
  // Ends every lane `connection` has (once; logged, if it was open, with `why`).
  void CloseLanes(Connection& connection, absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CloseLanes, and forgets the connection.
  void Close(Connection& connection, const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  // A lane's sending thread: Pull tensors and pull calls' answers in the order they were queued,
  // until it ends.
  void SendLoop(Lane& lane);
  // A call frame's payload that came on `lane` (the first) of connection `c`: to its handler, and
  // its answer sent (a pull's once the handler gives it). A status that is not OK ends the
  // connection.
  absl::Status OnCall(const std::shared_ptr<Lane>& lane, const Connection& c, FrameKind kind,
                      uint64_t transfer, std::string payload);
  // Sends a push call's answer on `lane`, from its reading thread (the lane is closed if it
  // cannot); SendBetween any frame so.
  static absl::Status SendAnswer(Lane& lane, uint64_t transfer, const CallAnswer& answer);
  static absl::Status SendBetween(Lane& lane, FrameHeader header, std::string_view payload);
  // Reads the tensor of push call `transfer` made on `lane` (the first of connection `c`),
  // striped over c's lanes, into `dst` as `type` values, by `deadline`: its first part here, the
  // others on their lanes once the client was told to send them (Proceed), `seen` told of each
  // run of them on the thread that read it. As FrameInbox::ReadCallValues and AwaitStriped fail;
  // INVALID_ARGUMENT for one sent last piece first.
  static absl::Status ReadStriped(Lane& lane, const Connection& c, uint64_t transfer,
                                  absl::Span<float> dst, WireType type, ValuesSeen seen,
                                  absl::Time deadline, ValuesOrder order);
  // The kind of reserved owner `owner` (null: none, or not a reserved owner), and what messages
  // call it.
  const OwnerKind* KindOf(int owner) const;
  std::string Who(int owner) const;
  // Open connection `connection`, if it is `owner`'s (FAILED_PRECONDITION otherwise).
  absl::StatusOr<std::shared_ptr<Connection>> Find(uint64_t connection, int owner);
  // Joins the threads of lanes that ended (all of them with `all`).
  void Reap(bool all);

  const Options options_;
  const std::unique_ptr<Listener> listener_;
  LogLimiter failed_handshakes_{absl::Minutes(1)};
  mutable absl::Mutex mu_;
  struct Issued {
    std::shared_ptr<Connection> connection;  // its lanes, as they say hello
    std::string secret;
    absl::Time expires;
  };
  std::map<uint64_t, Issued> tickets_ ABSL_GUARDED_BY(mu_);
  // Every lane accepted and not yet reaped (admitted or not, open or ended), and the open
  // connections by id.
  std::vector<std::shared_ptr<Lane>> all_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<Connection>> open_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<const CallHandlers> handlers_ ABSL_GUARDED_BY(mu_);
  int calls_running_ ABSL_GUARDED_BY(mu_) = 0;  // given to a handler and not yet answered
  std::thread accepting_;
  LogLimiter evicted_{absl::Minutes(1)};  // sockets closed to make room for newer ones
};

}  // namespace ps
