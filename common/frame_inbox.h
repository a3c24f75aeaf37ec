// The receiving half of a data-plane connection (common/data_frames.h), the same on both ends:
// calls say where the values of their transfer go (Expect), one thread reads the frames of the
// connection (ReadLoop) straight into those places, and each call waits for its own (Await). A
// frame no call expects (its call gave up) is read and dropped a piece at a time.
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

  // Transfer `transfer`'s values go into `dst` as `type` values, `seen` told of each run of them
  // on ReadLoop's thread (it must stay valid until Await returned). FAILED_PRECONDITION once the
  // connection ended; INVALID_ARGUMENT for a transfer already expected.
  absl::Status Expect(uint64_t transfer, absl::Span<float> dst, WireType type,
                      ValuesSeen seen = IgnoreValues);
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
    ValuesSeen seen;
    State state = State::kWaiting;
    absl::Status status;
  };

  Socket* const socket_;
  const FrameKind kind_;
  const uint64_t max_bytes_;
  mutable absl::Mutex mu_;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, Expected> expected_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps
