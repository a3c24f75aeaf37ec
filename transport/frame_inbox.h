// The receiving half of a data-plane connection (transport/data_frames.h), the same on both ends:
// calls say where the values of their transfer go (Expect), one thread reads the frames of the
// connection (ReadLoop) straight into those places, and each call waits for its own (Await). A
// frame no call expects (its call gave up) is read and dropped a piece at a time. The call can
// look at each run of its values as soon as it is in place (a shard scans a gradient while the
// rest is on its way): on the waiting thread while the reading one reads on, or, for a tensor
// striped over several connections (lanes), on each lane's reading thread, the parts at once.
// On a shard's lane, a PushCall, PullCall or ChangeCall frame goes to the lane's call handler
// (TakeCalls), which runs on the reading thread and reads a push's (or change's) tensor from there
// (ReadCallValues); on a client's, an Answer or Proceed frame goes to the call that expects it
// (ExpectAnswer).
//
// Thread-safe: ReadLoop runs on one thread; the rest on any, but for TakeCalls (before ReadLoop)
// and ReadCallValues (from the call handler).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "transport/data_frames.h"
#include "transport/socket.h"

namespace ps {

class FrameInbox {
 public:
  // Reads frames of `kind` (anything else ends the connection) of at most `max_bytes` from
  // `socket`, which must outlive this.
  FrameInbox(Socket* socket, FrameKind kind, uint64_t max_bytes)
      : socket_(socket), kind_(kind), max_bytes_(max_bytes) {}

  // Reads frames until the connection ends, then ends it (End) and returns why.
  absl::Status ReadLoop();

  // PushCall, PullCall and ChangeCall frames (of at most kMaxCallBytes) go to `on_call` with their
  // kind, transfer and payload, one at a time on ReadLoop's thread; a status it returns that is
  // not OK ends the connection. Without it they end it. Call before ReadLoop.
  using OnCall =
      absl::AnyInvocable<absl::Status(FrameKind kind, uint64_t transfer, std::string payload)>;
  void TakeCalls(OnCall on_call) { on_call_ = std::move(on_call); }
  // From the call handler: reads the next frame, which must be the tensor of call `transfer`
  // sent in `order`, into `dst` as `type` values, telling `seen` of each run of them on this
  // thread, before `deadline`. INVALID_ARGUMENT for a tensor of another size (the connection goes
  // on); any other failure (another frame, a cut, the deadline) ends the connection.
  absl::Status ReadCallValues(uint64_t transfer, absl::Span<float> dst, WireType type,
                              ValuesSeen seen, absl::Time deadline,
                              ValuesOrder order = ValuesOrder::kInOrder);
  // The Answer frame to call `transfer` goes into `answer` (which must stay valid until
  // AwaitAnswer returned); AwaitAnswer waits for it as Await does for values, and forgets it.
  // FAILED_PRECONDITION once the connection ended, INVALID_ARGUMENT for an answer already
  // expected. A call's answer and its pulled values are expected apart.
  absl::Status ExpectAnswer(uint64_t transfer, std::string* answer);
  absl::Status AwaitAnswer(uint64_t transfer, absl::Time deadline) {
    return Await(AnswerKey(transfer), deadline);
  }
  // For a striped push call: waits until the shard said Proceed (true; the answer is still
  // expected) or answered (false; AwaitAnswer then returns at once), until `deadline`.
  // UNAVAILABLE once the connection ended, DEADLINE_EXCEEDED at `deadline`; the answer is still
  // expected then (AwaitAnswer forgets it).
  absl::StatusOr<bool> AwaitProceed(uint64_t transfer, absl::Time deadline);

  // Transfer `transfer`'s values go into `dst` as `type` values, `on_read` told of each run of
  // them on ReadLoop's thread as it is in place (it must stay valid until Await returned).
  // FAILED_PRECONDITION once the connection ended; INVALID_ARGUMENT for a transfer already
  // expected.
  absl::Status Expect(uint64_t transfer, absl::Span<float> dst, WireType type,
                      ValuesSeen on_read = IgnoreValues);
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
    ValuesSeen on_read;
    State state = State::kWaiting;
    size_t in = 0;  // values of dst in place (decoded), from its start
    absl::Status status;
    std::string* answer = nullptr;  // an Answer's place, if this expects one
    bool proceed = false;           // a Proceed came for the call this expects the answer of
  };

  // Where an answer is expected: apart from its transfer's values (transfer ids stay below 2^63).
  static uint64_t AnswerKey(uint64_t transfer) { return transfer | (uint64_t{1} << 63); }
  // Reads an Answer frame's payload (header `h`) into the place its call expects, or drops it.
  absl::Status ReadAnswer(const FrameHeader& h);

  Socket* const socket_;
  const FrameKind kind_;
  const uint64_t max_bytes_;
  OnCall on_call_;
  mutable absl::Mutex mu_;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, Expected> expected_ ABSL_GUARDED_BY(mu_);
};

// A tensor striped over the lanes of a connection (transport/data_frames.h), part i expected on
// lane i's inbox (on as many lanes as StripeCount says), from part `from` on (a push call's first
// part is read by its handler). ExpectStriped expects the parts of
// `transfer` (it forgets those it expected when one cannot be), `on_read` told of each run of
// values on its part's reading thread as soon as it is in place (in order within a part; the
// parts at once, on threads of their own; a run is a part of dst). AwaitStriped waits for them
// and returns the first failure (one that ended its lane ends every lane, so that the other
// parts' waits end at once; a part forgotten before it came leaves the connection be), telling
// `seen` of each run on the waiting thread as it is in place when the tensor is one part (every
// value once when all came), and of none otherwise.
absl::Status ExpectStriped(absl::Span<FrameInbox* const> lanes, uint64_t transfer,
                           absl::Span<float> dst, WireType type, ValuesSeen on_read = IgnoreValues,
                           int from = 0);
absl::Status AwaitStriped(absl::Span<FrameInbox* const> lanes, uint64_t transfer, size_t values,
                          WireType type, absl::Time deadline, ValuesSeen seen = IgnoreValues,
                          int from = 0);

}  // namespace ps
