// The shard's end of the bulk data plane (common/data_frames.h): the tensor bytes of Push and Pull
// over one plain TCP connection per client, beside its gRPC calls, which keep the rest (tokens,
// deadlines, idempotence, validation, answers). gRPC streams stop near half of what a TCP
// connection carries (bench/RESULTS.md); this path sends a tensor as one frame, from the caller's
// buffer and into the shard's, with no copy in user space for float32.
//
// A client asks for a ticket over gRPC (AttachDataPlane, authorised like any call as the worker
// it names), connects to port() and presents it: a ticket opens one connection, once, within
// `hello` of being issued, and makes it that worker's (a worker's newer connection replaces its
// older one). A Push call that names a transfer on a connection takes its tensor from there
// (Receive): once the call has its buffer it tells the client to send (gRPC initial metadata),
// and the frame is read straight into that buffer; a frame no call waits for is read and dropped.
// A Pull call that names one has its values sent there (Send) and is answered once they are
// written.
//
// Every wait has an end: a hello within `hello`, a frame's bytes moving at least every `stall`.
// Anything unexpected on a connection (a bad frame, a stalled peer, a call that gave up
// mid-tensor) ends that connection only; its client sends over gRPC meanwhile. At most
// `max_connections` connections (two threads each) and unused tickets; no buffer is allocated
// for a frame: it goes into its call's buffer or is dropped a piece at a time. Thread-safe.
#pragma once

#include <cstdint>
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
#include "common/data_frames.h"
#include "common/socket.h"
#include "common/wire_type.h"

namespace ps {

class DataPlane {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    int port = 0;  // 0: a free one
    int max_connections = 64;
    uint64_t max_frame_bytes = 0;  // the largest tensor (the shard's range as float32)
    absl::Duration hello = absl::Seconds(5);
    absl::Duration stall = absl::Seconds(10);
  };
  // Listens (UNAVAILABLE naming host:port and why if it cannot) and starts accepting.
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
  };
  // A ticket for worker `owner` (negative: an observer). RESOURCE_EXHAUSTED when as many
  // connections and tickets as allowed exist.
  absl::StatusOr<Ticket> Issue(int owner);

  // The tensor a client sends on connection `connection` as `transfer`, into `dst` as `type`
  // values, `seen` told of each run of them as it comes in: waits for it, once ready() told the
  // client to send it, until `deadline`.
  // FAILED_PRECONDITION when the connection is not `owner`'s or no longer open (ready() not
  // called), UNAVAILABLE when it ended before the whole tensor came, DEADLINE_EXCEEDED when the
  // tensor did not come in time (the connection is then ended if it was coming), INVALID_ARGUMENT
  // for a tensor of another size. `dst` is not written once this returned.
  absl::Status Receive(uint64_t connection, int owner, uint64_t transfer, absl::Span<float> dst,
                       WireType type, absl::Time deadline, absl::FunctionRef<void()> ready,
                       ValuesSeen seen = IgnoreValues);

  // Called once the values of a Send are written (the number saturated to the wire type's range)
  // or could not be (UNAVAILABLE: the connection ended).
  using Sent = absl::AnyInvocable<void(absl::StatusOr<int64_t>)>;
  // Sends `values` as `type` on connection `connection` as transfer `transfer`, on the
  // connection's own thread, and then calls `sent` there. With `filling`, `values` are still
  // being filled: each piece goes once it is in place (SendValues). `values` and `filling` must
  // stay alive until `sent` is called: `keep` is held until then for that (or the caller keeps
  // them itself).
  // FAILED_PRECONDITION at once, `sent` not called, when the connection is not `owner`'s or no
  // longer open.
  absl::Status Send(uint64_t connection, int owner, uint64_t transfer,
                    std::shared_ptr<const void> keep, absl::Span<const float> values, WireType type,
                    Sent sent, const FillProgress* filling = nullptr);

  // Ends worker `owner`'s connection (it left).
  void Release(int owner);
  // Connections open now.
  int connections() const;

 private:
  class Connection;
  DataPlane(Options options, std::unique_ptr<Listener> listener);
  // Accepts connections (each served by Serve on a thread of its own) and joins those that ended.
  void AcceptLoop();
  // A connection's reading thread: its hello (Admit), then its Push frames until it ends.
  void Serve(std::shared_ptr<Connection> connection);
  // Reads the hello and answers it: OK (Welcome sent, the connection registered as its ticket's
  // owner's) or why not (Refused sent).
  absl::Status Admit(const std::shared_ptr<Connection>& connection);
  // A connection's sending thread: Pull answers in the order they were queued, until it ends.
  void SendLoop(Connection& connection);
  // Open connection `connection`, if it is `owner`'s (FAILED_PRECONDITION otherwise).
  absl::StatusOr<std::shared_ptr<Connection>> Find(uint64_t connection, int owner);
  // Joins the threads of connections that ended (all of them with `all`).
  void Reap(bool all);

  const Options options_;
  const std::unique_ptr<Listener> listener_;
  mutable absl::Mutex mu_;
  struct Issued {
    int owner;
    std::string secret;
    absl::Time expires;
  };
  std::map<uint64_t, Issued> tickets_ ABSL_GUARDED_BY(mu_);
  // Every connection accepted and not yet reaped (admitted or not, open or ended), and the open
  // ones by id.
  std::vector<std::shared_ptr<Connection>> all_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<Connection>> open_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::thread accepting_;
};

}  // namespace ps
