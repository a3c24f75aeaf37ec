// The worker-side view of the parameter servers: one flat parameter vector split over S shards.
//
// Calls go to all shards at once, but for a started pull where hosts hold several shards (see
// StartPull). StartPull and StartPush return a Pending call at once (the
// shape of ps-lite's Push/Pull/Wait): Wait() gives its result, and Pull and Push are Start + Wait.
// The shards' calls run on threads the client keeps: one is made only when more shard calls are
// in flight than threads are idle, and none ends before the client, so a worker's steady loop of
// pulls and pushes starts no thread. A call that is waited for at once (Pull, Push, and the
// others that return their result) runs its last shard's part on the caller's thread: with one
// shard, no thread hand-off at all. A Pending may outlive the client (its Wait then returns
// what the call got, CANCELLED at worst).
//
// Every call has a deadline and carries the token of ClientOptions::security (over TLS if set
// there), and calls that failed for a transient reason (UNAVAILABLE, DEADLINE_EXCEEDED,
// RESOURCE_EXHAUSTED, and CANCELLED by the shard: one shutting down cancels what it did not
// finish) are retried with backoff (50 ms doubling to 0.5 s), all in one retry loop; channels
// reconnect as promptly and notice a peer that stopped answering within seconds
// (transport/channel_options.h). Retrying is safe: pulls are
// reads, pushes carry a (worker, sequence) id that a shard applies once. A pull that a shard holds
// back (ABORTED: sync barrier, SSP bound) is repeated for as long as it takes.
//
// A shard that restarted (a new process, resumed from its checkpoint) refuses calls made under
// the old registration; the client then registers with it again by itself and repeats the call.
// A shard that came back without the model it held (no checkpoint) fails every call with
// FAILED_PRECONDITION naming it: the job cannot go on, and nothing is re-initialised.
//
// A shard listed as two replicas ("primary/backup", ps --peer) is called at the one that served
// last; a retried call that finds it unreachable or unavailable (or past the deadline) is tried at
// the other at once (which takes over if the primary is gone), and the client registers with it
// as with a restarted shard.
//
// With a shard on the same host (ClientOptions::shared_memory), tensors go through a segment of
// shared memory that client and shard both map, negotiated at registration; with one elsewhere
// (ClientOptions::data_plane), over a TCP connection of the client's own to the shard's data
// plane, opened with a ticket from the shard at registration. The calls still go over gRPC
// (deadlines, token, retries as above). A shard that offers neither, or a path that stopped
// working: tensors go over gRPC's streams, as they always can (a failed call is repeated there at
// once; shared memory, else the data plane, is asked for again with backoff: client/
// shard_session.h).
//
// With ClientOptions::pull_compression, a worker's pulls bring only the change since its last
// pull, compressed; the shard keeps the worker's view of its range to compute it, the client its
// own copy (server/rpc/pull_views.h). Such pulls go over gRPC.
//
// The client keeps a worker's bookkeeping: the sequence number each push carries (from Register
// on, one more per push) and the versions of the weights its last pull saw (a push's base: what
// staleness is measured from), so callers pass tensors only.
//
// A push can be sent shard by shard (Parts::kHeld): a worker whose backward pass produces the
// gradient's last layers first sends each shard's part as soon as its range is final, so that
// communication overlaps the rest of backward (as DDP and Horovod do); the push keeps one
// sequence and one base over its parts. Likewise a pull's values can be waited for as they
// arrive (Pending::WaitValues), so that a forward pass starts on the first layers' weights
// (trainer/overlapped_step.h does both).
//
// Thread-safe, with one rule: pushes take increasing sequences in the order they start, so start
// them from one thread. Registering again happens on whichever call meets the restart first (once
// per restart: the others wait for it).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/compression.h"
#include "common/model_identity.h"
#include "common/partition.h"
#include "transport/security.h"
#include "common/wire_type.h"

namespace ps {
class PullFill;  // client/pull_fill.h: how far a pull's values are in place
namespace v1 {
class CheckpointResponse;  // proto/ps.pb.h
class StatsResponse;
}  // namespace v1

struct ClientOptions {
  absl::Duration rpc_timeout = absl::Seconds(10);  // deadline of each attempt
  absl::Duration retry_for = absl::Seconds(60);    // give up after transient failures this long
  // ... and this long at a shard none of whose replicas this client ever reached (a wrong
  // address); at most retry_for.
  absl::Duration connect_for = absl::Seconds(60);
  // TLS credentials (default: plaintext) and the token every call carries (default: none).
  ClientSecurity security = {};
  // What gradients and pulled weights travel as (common/wire_type.h).
  WireType push_type = WireType::kFloat32;
  WireType pull_type = WireType::kFloat32;
  // Compresses gradients instead (common/compression.h; push_type then plays no part), keeping
  // what compression leaves out for the next push unless error_feedback is false
  // (client/push_compressor.h).
  Compression compression = {};
  bool error_feedback = true;
  // Compresses pulls too (a worker's only; over gRPC): each shard keeps what this client holds of
  // its range and sends the change since its last pull, compressed, with the part compression
  // left out carried to later pulls (server/rpc/pull_views.h). The client keeps a copy of the
  // weights (and a change buffer) for it; a first pull, and any after a failed or restarted one,
  // come whole as pull_type.
  Compression pull_compression = {};
  // Move tensors through shared memory with shards on this host (transport/shared_memory.h).
  bool shared_memory = true;
  // Move the others over the shards' data plane (transport/data_plane.h), not gRPC's streams.
  bool data_plane = true;
  // The job's number of workers as this client was told (worker --num_workers), which a shard
  // checks at registration against its own; 0: not checked (observers, tools).
  int num_workers = 0;
};

class ShardedClient {
 private:
  class Impl;
  class Call;      // one call to every shard, in progress or done
  class PushFill;  // how far a held push's gradient is final (Pending::Filled)
  // How a call's shard parts start: all at once on the client's threads, each held until the
  // call's Send, or the last one on the caller's thread once the others are started (a call that
  // is waited for at once: it is not handed to a thread and back).
  enum class Launch { kNow, kHeld, kLastHere };

 public:
  // The version of each shard a pull saw, and which process of that shard served it: a restarted
  // shard's versions go on from its checkpoint, so a version means something only with it.
  struct Versions {
    std::vector<int64_t> version;
    std::vector<int64_t> shard_incarnation;  // 0: unknown (taken as the current process)
    Versions() = default;
    Versions(std::initializer_list<int64_t> v) : version(v), shard_incarnation(v.size(), 0) {}
    int64_t Min() const;
  };

  struct PushSummary {
    int64_t sequence = 0;       // what the push carried
    int64_t max_staleness = 0;  // over shards
    int duplicates = 0;         // shards that had applied this sequence before
    int dropped = 0;            // shards whose consistency policy dropped it (counted there)
    int64_t saturated = 0;      // gradient values beyond the wire type's range, sent as its largest
  };

  // A call to every shard in progress. Wait() blocks until every shard has answered (or the call
  // failed) and returns the result; a second Wait returns FAILED_PRECONDITION. The call reads or
  // writes the caller's buffer until it ends, so destroying (or assigning over) a Pending that
  // was not waited for waits for it. Default-constructed: no call (valid() is false).
  //
  // A call whose parts are held (StartPush with Parts::kHeld) sends shard s's part at Send(s);
  // Wait sends the parts still held first. Destroyed before Wait, it sends none of them: they
  // end CANCELLED (a backward pass that failed midway left their ranges unfinished), as they do
  // at CancelPending and Close. Such a push may also be told how far a backward pass has filled
  // its gradient in (Filled), and then starts each part before its range is final where the
  // shard takes its values as they come; dropped then (destroyed unwaited, CancelPending), such
  // a part is cut off midway (the shard applies nothing of it) and ends CANCELLED too, not
  // retried, its data-plane connection replaced by a new one. A part sent as backward makes it
  // takes what backward takes (up to 10 min; its answer is waited for an attempt's time,
  // ClientOptions::rpc_timeout, after its last piece went); the shard's data plane ends a
  // connection that moves no byte for its stall limit (10 s), so a gap that long between two
  // final pieces fails the attempt, and the part goes again once whole.
  template <typename T>
  class Pending {
   public:
    Pending() = default;
    Pending(Pending&& o) noexcept = default;
    Pending& operator=(Pending&& o) noexcept {
      if (this != &o) {
        Finish();
        call_ = std::move(o.call_);
        result_ = std::move(o.result_);
        fill_ = std::move(o.fill_);
        arrival_ = std::move(o.arrival_);
      }
      return *this;
    }
    ~Pending() { Finish(); }
    bool valid() const { return call_ != nullptr; }
    // Sends shard `shard`'s part of a call whose parts are held (its range of the gradient is
    // final); nothing if it was sent already.
    void Send(int shard) {
      if (call_ == nullptr) return;
      FillFinal(fill_.get(), shard);
      SendPart(*call_, shard);
    }
    // Sends every part still held (Wait does so first).
    void SendAll() {
      if (call_ == nullptr) return;
      FillFinal(fill_.get(), -1);
      SendRest(*call_);
    }
    // A push whose parts are held, its gradient filled in from the end by a backward pass: values
    // [from, end) are final now (`from` only goes down). A part whose range is all final is sent
    // as at Send; one with final values starts already where its shard takes a push's values as
    // they come (a data-plane call, float32, uncompressed: transport/data_frames.h's
    // ValuesOrder::kLastPieceFirst), its values going out as they become final. Nothing for other
    // calls.
    void Filled(int64_t from) {
      if (call_ != nullptr && fill_ != nullptr) FillFrom(*fill_, *call_, from);
    }
    // Waits for shard `shard`'s part of the call and returns how it ended (a pull's part is in the
    // caller's buffer once this is OK), while the others may go on; Wait still gives the result.
    // A held part is sent first. FAILED_PRECONDITION after Wait; INVALID_ARGUMENT for a shard
    // the client does not have.
    absl::Status WaitPart(int shard) { return *WaitPart(shard, absl::InfiniteDuration()); }
    // The same, waiting at most `timeout`: nullopt while the part is still in progress.
    std::optional<absl::Status> WaitPart(int shard, absl::Duration timeout) {
      if (call_ == nullptr) return absl::FailedPreconditionError("no call to wait for");
      FillFinal(fill_.get(), shard);
      SendPart(*call_, shard);
      return AwaitPart(*call_, shard, timeout);
    }
    // A pull's values [begin, end) of the caller's buffer hold what the pull brought, while the
    // rest may still be coming: each shard's part arrives from its start (over the data plane or
    // gRPC's stream; through shared memory or compressed, whole), so a forward pass starts on a
    // layer's weights as soon as they are in, not its shard's whole part. Waits for that, at
    // most `timeout` (nullopt while they are still coming), and returns the error of a part that
    // failed first. Values used so are kept: should the attempt that brought them fail, their
    // part is not tried again (a retry would rewrite them and the versions they came with), and
    // the call fails ABORTED: compute again on a new pull. FAILED_PRECONDITION for a push, or
    // after Wait; INVALID_ARGUMENT for a range outside the buffer.
    std::optional<absl::Status> WaitValues(int64_t begin, int64_t end, absl::Duration timeout) {
      if (call_ == nullptr || arrival_ == nullptr) {
        return absl::FailedPreconditionError("no pull to wait for");
      }
      return AwaitValues(*call_, *arrival_, begin, end, timeout);
    }
    absl::Status WaitValues(int64_t begin, int64_t end) {
      return *WaitValues(begin, end, absl::InfiniteDuration());
    }
    // Whether the call has ended, waiting up to `timeout` for it (Wait then returns at once).
    bool Done(absl::Duration timeout) const { return call_ == nullptr || Ended(*call_, timeout); }
    absl::StatusOr<T> Wait() {
      if (call_ == nullptr) return absl::FailedPreconditionError("no call to wait for");
      std::shared_ptr<Call> call = std::move(call_);
      FillFinal(fill_.get(), -1);
      SendRest(*call);
      absl::Status s = Await(*call);
      if (!s.ok()) return s;
      return result_();
    }

   private:
    friend class ShardedClient;
    Pending(std::shared_ptr<Call> call, std::function<T()> result,
            std::shared_ptr<PushFill> fill = nullptr, std::shared_ptr<PullFill> arrival = nullptr)
        : call_(std::move(call)),
          result_(std::move(result)),
          fill_(std::move(fill)),
          arrival_(std::move(arrival)) {}
    void Finish() {
      if (call_ == nullptr) return;
      std::shared_ptr<Call> call = std::exchange(call_, nullptr);
      FillStop(fill_.get());  // parts sending as the gradient fills get no more of it
      Abandon(*call);
      Await(*call).IgnoreError();
    }
    std::shared_ptr<Call> call_;
    std::function<T()> result_;       // the call's value, once it succeeded
    std::shared_ptr<PushFill> fill_;  // a held push's: how far its gradient is final
    std::shared_ptr<PullFill> arrival_;  // a pull's: how far its values are in place
  };

  // `model.num_shards` must equal addresses.size(); an address may list a shard's two replicas
  // ("a/b", see common/cluster.h). worker_id < 0 makes an observer, which may pull but not push.
  ShardedClient(std::vector<std::string> addresses, ModelIdentity model, int worker_id,
                ClientOptions options = {});
  // Ends the calls in progress (CANCELLED) and waits for those started (StartPull, StartPush).
  // As with any object, no other thread may still be inside one of its methods (Pull, Push, ...:
  // they may run a shard's part on their own thread).
  ~ShardedClient();

  int num_shards() const;
  const ModelIdentity& model() const;
  int worker_id() const;  // < 0: an observer
  // Shard `shard`'s range of the flat vector: what its part of a pull or push is.
  Range shard_range(int shard) const;

  // Registers with every shard (checking they agree on the model) and returns the sequence number
  // this worker's next push carries, which is also the step a restarted worker resumes at: one
  // past the lowest last sequence over the shards, so that a step that reached only some shards
  // is delivered to the others (those that have it answer duplicate); in rounds (sync, local),
  // one past the highest (that step's round has closed). Fails (FAILED_PRECONDITION) if some
  // shards hold a trained model and others none, or if a shard speaks another wire version
  // (common/version.h: the message names both releases).
  absl::StatusOr<int64_t> Register();
  // The shards' consistency model (common/consistency_spec.h), known after Register.
  const std::string& consistency() const;
  // This process's incarnation at shard `shard`, from Register (0 before): pushes, heartbeats and
  // Leave carry it, and a later Register of the same worker id elsewhere supersedes it.
  int64_t incarnation(int shard) const;
  // How many times this client registered again with a restarted shard.
  int reregistrations() const;

  // Offers initial values to every shard. Shards already initialised keep their values, so a
  // restarted initialiser never resets a trained model. Returns how many shards took the values.
  absl::StatusOr<int> Initialize(absl::Span<const float> params);

  // Fills `params` (total_params floats, valid until the call ends) from all shards, waiting for
  // initialisation if needed (up to ClientOptions::retry_for); the result is what each shard
  // served, which the client also keeps (last_pull()) once Wait returned it. `prefetch`: the
  // pull is of the weights for this worker's next step, made before its current step's push has
  // landed (started before that push, or while it is in flight: see PullRequest.after_sequence).
  // Its values are for use as they arrive (Pending::WaitValues). Where a host holds several shards
  // (listed "a:1", "b:1", "a:2", "b:2", ...: the flat vector's parts spread over the hosts), the
  // parts on each host go one after another in the list's order, so the first values come first
  // at every host's whole rate (Wait and SendAll send the rest at once, WaitPart its own part;
  // Done and WaitValues send nothing); a push's parts go as backward makes them, the last first,
  // which keeps every host's link busy from the start of backward. A prefetch's parts go at once
  // (it runs while the step's push fills the same links: in order, its later parts came too
  // late), and so do those of shards on 127.0.0.1, localhost or ::1, or reached through shared
  // memory (this machine: no link between them).
  Pending<Versions> StartPull(absl::Span<float> params, bool prefetch = false);
  absl::StatusOr<Versions> Pull(absl::Span<float> params);
  // The versions of the last pull whose Wait returned them; before any, version 0 everywhere.
  Versions last_pull() const;

  // Pushes each shard its slice of `gradient` (valid until the call ends), computed from the
  // weights of last_pull() (a shard that restarted since that pull gets it as computed from its
  // current version). It carries the client's next sequence (a push that failed uses its
  // sequence up), or `sequence` when given, which must not be below it: for a caller that numbers
  // pushes by its own steps (local SGD pushes every few steps, and Register's answer is then the
  // step to resume at). `parts`: kAllNow sends every shard its part at once; kHeld takes the
  // sequence and base now and sends each part at Pending::Send (see Pending).
  static constexpr int64_t kNextSequence = -1;
  enum class Parts { kAllNow, kHeld };
  Pending<PushSummary> StartPush(absl::Span<const float> gradient, int64_t sequence = kNextSequence,
                                 Parts parts = Parts::kAllNow);
  absl::StatusOr<PushSummary> Push(absl::Span<const float> gradient,
                                   int64_t sequence = kNextSequence);

  // Every shard's statistics (GetStats: a page of at most 256 workers per call, fetched one after
  // another and joined), by shard. Fails like any call, DATA_LOSS for an answer that does not
  // parse, or FAILED_PRECONDITION for a shard of another wire version (common/version.h).
  absl::StatusOr<std::vector<v1::StatsResponse>> Stats();
  // Asks every shard to write a checkpoint now (the write token's right), retried like the other
  // calls (a tool that must not repeat a long write sets LimitCallsTo first); the answers by shard.
  absl::StatusOr<std::vector<v1::CheckpointResponse>> Checkpoint();

  // Refreshes this worker's lease on every shard: one attempt each, with `timeout` (keep it well
  // under the lease, so that one stalled shard does not delay the others' heartbeats).
  absl::Status Heartbeat(absl::Duration timeout);

  // Tells every shard this worker is stopping (one attempt each, `timeout`), so that barriers do
  // not wait out its lease.
  absl::Status Leave(absl::Duration timeout);

  // From now on every call makes one attempt of at most `timeout`: for a last call at shutdown,
  // which must not wait on a dead shard. Call while no other call is in progress.
  void LimitCallsTo(absl::Duration timeout);

  // Ends the calls in progress, retries and backoff included, with CANCELLED. Calls started
  // afterwards work as usual. For shutdown: a pull held at a barrier returns now.
  void CancelPending();
  // Ends the calls in progress and every later one with CANCELLED: for a process that is giving
  // up (a call on another thread that has not started yet cannot slip through).
  void Close();

 private:
  static absl::Status Await(Call& call);
  static bool Ended(Call& call, absl::Duration timeout);
  static std::optional<absl::Status> AwaitPart(Call& call, int shard, absl::Duration timeout);
  static std::optional<absl::Status> AwaitValues(Call& call, PullFill& fill, int64_t begin,
                                                 int64_t end, absl::Duration timeout);
  static void SendPart(Call& call, int shard);
  static void SendRest(Call& call);
  static void Abandon(Call& call);
  static void FillFrom(PushFill& fill, Call& call, int64_t from);
  static void FillFinal(PushFill* fill, int shard);  // shard < 0: every part; fill may be null
  static void FillStop(PushFill* fill);              // fill may be null
  Pending<Versions> BeginPull(absl::Span<float> params, bool prefetch, Launch launch);
  Pending<PushSummary> BeginPush(absl::Span<const float> gradient, int64_t sequence, Launch launch);
  std::unique_ptr<Impl> impl_;
};

// Cancels a client's pending calls once SIGTERM/SIGINT arrives, so that a process waiting on a
// shard (for the initialiser, at a barrier, or retrying) stops at once. Destruction requests
// shutdown and joins the thread: declare it after the client it watches.
class CancelOnShutdown {
 public:
  explicit CancelOnShutdown(ShardedClient* client);
  ~CancelOnShutdown() { Join(); }
  // Requests shutdown and returns once the pending calls were cancelled; calls made afterwards
  // (a last Leave, a final pull) are not cancelled. Idempotent.
  void Join();

 private:
  std::thread thread_;
};

}  // namespace ps
