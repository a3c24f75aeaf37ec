// The receiving half of a data-plane connection (common/data_frames.h), the same on both ends:
// calls say where the values of their transfer go (Expect), one thread reads the frames of the
// connection (ReadLoop) straight into those places, and each call waits for its own (Await),
// looking at each run of its values on its own thread as soon as the run is in place (a shard
// scans a gradient while the rest is still coming; the reading thread only reads). A frame no
// call expects (its call gave up) is read and dropped a piece at a time.
//
// Thread-safe: ReadLoop runs on one thread; Expect, Await and End on any.
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

class FrameInbox {
 public:
  // Reads frames of `kind` (anything else ends the connection) of at most `max_bytes` from
  // `socket`, which must outlive this.
  FrameInbox(Socket* socket, FrameKind kind, uint64_t max_bytes)
      : socket_(socket), kind_(kind), max_bytes_(max_bytes) {}

  // Reads frames until the connection ends, then ends it (End) and returns why.
  absl::Status ReadLoop();

  // Transfer `transfer`'s values go into `dst` as `type` values. FAILED_PRECONDITION once the
  // connection ended; INVALID_ARGUMENT for a transfer already expected.
  absl::Status Expect(uint64_t transfer, absl::Span<float> dst, WireType type);
  // Waits until transfer `transfer` (expected) is in, then forgets it, telling `seen` of each run
  // of its values on this thread, in order, as soon as the run is in place (every value once when
  // it came whole; a prefix when it did not). Returns its frame's status (INVALID_ARGUMENT for
  // one of another size than expected); UNAVAILABLE when the connection ended before it came;
  // DEADLINE_EXCEEDED at `deadline` (a frame still coming then ends the connection, so that
  // nothing writes into its place once this returned).
  absl::Status Await(uint64_t transfer, absl::Time deadline, ValuesSeen seen = IgnoreValues);

  // Ends the connection: the socket is shut down, ReadLoop returns, waiting calls wake.
  void End();
  bool ended() const;

 private:
  enum class State { kWaiting, kFilling, kDone };
  struct Expected {
    absl::Span<float> dst;
    WireType type;
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
// lane i's inbox. ExpectStriped expects the parts of `transfer` (on as many lanes as StripeCount
// says; it forgets those it expected when one cannot be); AwaitStriped waits for them in order,
// telling `seen` of the values in order (FrameInbox::Await) and returns the first failure: one
// that is not the tensor's size ends every lane, so that the other parts' waits end at once.
absl::Status ExpectStriped(absl::Span<FrameInbox* const> lanes, uint64_t transfer,
                           absl::Span<float> dst, WireType type);
absl::Status AwaitStriped(absl::Span<FrameInbox* const> lanes, uint64_t transfer, size_t values,
                          WireType type, absl::Time deadline, ValuesSeen seen = IgnoreValues);

}  // namespace ps
