// The receiving half of a data-plane connection (common/data_frames.h), the same on both ends:
// calls say where the values of their transfer go (Expect), one thread reads the frames of the
// connection (ReadLoop) straight into those places, and each call waits for its own (Await). A
// frame no call expects (its call gave up) is read and dropped a piece at a time. A tensor
// striped over several connections (lanes) is expected and awaited on all of them at once
// (ExpectStriped, AwaitStriped); the waiting call can look at each run of it as soon as it is in
// place, whichever lane it came on (a shard scans a gradient while the rest is on its way; the
// reading threads only read).
//
// Thread-safe: ReadLoop runs on one thread; the rest on any.
#pragma once

#include <cstdint>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/data_frames.h"
#include "common/socket.h"

namespace ps {

// Counts events (values of a transfer came in, a transfer ended) for a call waiting on several
// inboxes at once. Thread-safe.
class Arrivals {
 public:
  void Note();
  uint64_t count() const;
  // Waits until count() is past `seen`, or `deadline`; returns whether it is.
  bool WaitPast(uint64_t seen, absl::Time deadline) const;

 private:
  mutable absl::Mutex mu_;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

class FrameInbox {
 public:
  // Reads frames of `kind` (anything else ends the connection) of at most `max_bytes` from
  // `socket`, which must outlive this.
  FrameInbox(Socket* socket, FrameKind kind, uint64_t max_bytes)
      : socket_(socket), kind_(kind), max_bytes_(max_bytes) {}

  // Reads frames until the connection ends, then ends it (End) and returns why.
  absl::Status ReadLoop();

  // Transfer `transfer`'s values go into `dst` as `type` values, `arrivals` (if any; it must
  // outlive the transfer) told whenever some come in or the transfer ends. FAILED_PRECONDITION
  // once the connection ended; INVALID_ARGUMENT for a transfer already expected.
  absl::Status Expect(uint64_t transfer, absl::Span<float> dst, WireType type,
                      Arrivals* arrivals = nullptr);
  // How far an expected transfer is: values of dst in place (decoded, from its start); whether
  // it is over (in whole, failed, or never to come), and failed.
  struct Progress {
    size_t in = 0;
    bool over = false;
    bool failed = false;
  };
  Progress Peek(uint64_t transfer) const;
  // Waits until transfer `transfer` (expected) is in, then forgets it: its frame's status
  // (INVALID_ARGUMENT for one of another size than expected); UNAVAILABLE when the connection
  // ended before it came; DEADLINE_EXCEEDED at `deadline` (a frame still coming then ends the
  // connection, so that nothing writes into its place once this returned).
  absl::Status Await(uint64_t transfer, absl::Time deadline);

  // Ends the connection: the socket is shut down, ReadLoop returns, waiting calls wake.
  void End();
  bool ended() const;

 private:
  enum class State { kWaiting, kFilling, kDone };
  struct Expected {
    absl::Span<float> dst;
    WireType type;
    Arrivals* arrivals;
    State state = State::kWaiting;
    size_t in = 0;  // values of dst in place (decoded), from its start
    absl::Status status;
  };

  Socket* const socket_;
  const FrameKind kind_;
  const uint64_t max_bytes_;
  mutable absl::Mutex mu_;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, Expected> expected_ ABSL_GUARDED_BY(mu_);
};

// A tensor striped over the lanes of a connection (common/data_frames.h), part i expected on
// lane i's inbox (on as many lanes as StripeCount says). ExpectStriped expects the parts of
// `transfer` (it forgets those it expected when one cannot be). AwaitStriped waits for them and
// returns the first failure (one that is not a part's size ends every lane, so that the other
// parts' waits end at once); with `arrivals` (the one given to ExpectStriped), it tells `seen` of
// each run of values on this thread as soon as it is in place, on whichever lane: every value
// once when all came, in order within a part (ValuesSeen: a run is a part of dst).
absl::Status ExpectStriped(absl::Span<FrameInbox* const> lanes, uint64_t transfer,
                           absl::Span<float> dst, WireType type, Arrivals* arrivals = nullptr);
absl::Status AwaitStriped(absl::Span<FrameInbox* const> lanes, uint64_t transfer,
                          absl::Span<const float> dst, WireType type, absl::Time deadline,
                          Arrivals* arrivals = nullptr, ValuesSeen seen = IgnoreValues);

}  // namespace ps
