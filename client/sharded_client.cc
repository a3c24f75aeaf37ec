#include "client/sharded_client.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "transport/channel_options.h"
#include "transport/chunking.h"
#include "common/cluster.h"
#include "client/connection_probe.h"
#include "common/consistency_spec.h"
#include "transport/data_connection.h"
#include "transport/data_frames.h"
#include "common/fill_progress.h"
#include "transport/grpc_method.h"
#include "transport/grpc_status.h"
#include "common/log.h"
#include "common/partition.h"
#include "transport/shared_memory.h"
#include "common/shutdown.h"
#include "transport/tensor_codec.h"
#include "proto/ps.grpc.pb.h"
#include "client/pull_fill.h"
#include "client/push_compressor.h"

namespace ps {
namespace {

// How to get a job whose shard lost its model going again.
constexpr char kLostModelFix[] =
    "Restart it with the --checkpoint_dir it wrote checkpoints to, or start the whole job again";

// Worth another attempt: the shard was unreachable, slow, or busy (RESOURCE_EXHAUSTED: it
// already serves as many calls as it allows).
bool IsTransient(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
         s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
}

// Streams `values` as `Chunk` messages of `type` values on raw bytes, the first also carrying
// `first`'s header. Each chunk is encoded (float32: copied) into a buffer its slice owns: gRPC may
// still hold a failed call's bytes after the call returned, when the caller may reuse or free
// `values`. Returns how many values were saturated to the type's range.
template <typename Chunk>
int64_t WriteTensorChunks(grpc::ClientWriter<grpc::ByteBuffer>* writer, const Chunk& first,
                          absl::Span<const float> values, WireType type) {
  bool ok = true;
  int64_t saturated = 0;
  const std::string head = first.SerializeAsString();
  ForEachChunk(values, kChunkBytes / WireBytes(type), [&](int64_t index, std::string_view raw) {
    if (!ok) return;
    absl::Span<const float> piece(reinterpret_cast<const float*>(raw.data()),
                                  raw.size() / sizeof(float));
    auto encoded = std::make_shared<std::string>();
    saturated += EncodeValues(piece, type, encoded.get());
    ok = writer->Write(EncodeWithTensor(index == 0 ? head : std::string(), Chunk::kDataFieldNumber,
                                        *encoded, encoded));
  });
  return saturated;
}

// Streams a compressed tensor as `Chunk` messages of whole units (a block, a pair), the first also
// carrying `first`'s header; the slices reference `tensor`, which they keep alive.
template <typename Chunk>
void WriteCompressedChunks(grpc::ClientWriter<grpc::ByteBuffer>* writer, const Chunk& first,
                           const std::shared_ptr<const CompressedTensor>& tensor) {
  std::string head = first.SerializeAsString();
  bool ok = true;
  ForEachUnitChunk(
      tensor->bytes, CompressedUnitBytes(tensor->compressor), [&](std::string_view piece) {
        if (!ok) return;
        ok = writer->Write(
            EncodeWithTensor(std::exchange(head, {}), Chunk::kDataFieldNumber, piece, tensor));
      });
}

// How long a call waits for a region of shared memory that a call this client abandoned still
// uses at the shard (it is copying: milliseconds); past it, the shard is taken to be stuck.
absl::Time ClaimDeadline(const grpc::ClientContext& context) {
  return std::min(absl::FromChrono(context.deadline()), absl::Now() + absl::Seconds(1));
}

// Threads that run the shards' calls, kept for reuse: a task runs on an idle thread, or on a new
// one when none is idle, so there are as many as calls have been in flight at once (a few per
// shard: a pull, a push, a heartbeat). Destruction runs what is queued, then joins them.
class CallThreads {
 public:
  CallThreads() = default;
  CallThreads(const CallThreads&) = delete;
  CallThreads& operator=(const CallThreads&) = delete;
  ~CallThreads() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (std::thread& t : threads_) t.join();
  }
  // Runs work(), then then(). The thread counts as idle again before then() runs, so a caller
  // that then() wakes and that starts the next call at once finds it free.
  void Run(std::function<void()> work, std::function<void()> then) {
    absl::MutexLock lock(&mu_);
    queue_.push_back({std::move(work), std::move(then)});
    if (idle_ < static_cast<int>(queue_.size())) threads_.emplace_back([this] { Loop(); });
  }

 private:
  struct Task {
    std::function<void()> work, then;
  };
  void Loop() {
    absl::MutexLock lock(&mu_);
    ++idle_;
    for (;;) {
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, and nothing left to run
      Task task = std::move(queue_.front());
      queue_.pop_front();
      --idle_;
      mu_.Unlock();
      task.work();
      mu_.Lock();
      ++idle_;
      mu_.Unlock();
      task.then();
      mu_.Lock();
    }
  }

  absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

// One call to every shard: each shard's attempts run on a CallThreads thread (or the caller's,
// Launch::kLastHere) and report here. `on_end` runs once every shard reported (succeeded or not),
// before Wait returns, on the thread that reported last (so while the client exists: a Pending
// may outlive it); `on_part`, if any, after each shard's report, on the thread that reported.
// A shard's start may be held (Hold) until Send, or abandoned: it then reports `why`.
class ShardedClient::Call {
 public:
  Call(int shards, std::function<void()> on_end, std::function<void(int)> on_part)
      : shards_(shards),
        on_end_(std::move(on_end)),
        on_part_(std::move(on_part)),
        held_(shards),
        results_(shards),
        reported_(shards, 0),
        pending_(shards) {}
  void Hold(int shard, std::function<void()> start) {
    absl::MutexLock lock(&mu_);
    held_[shard] = std::move(start);
  }
  // Starts shard's call if it is held.
  void Send(int shard) {
    std::function<void()> start;
    {
      absl::MutexLock lock(&mu_);
      if (shard < 0 || shard >= shards_) return;
      start = std::exchange(held_[shard], nullptr);
    }
    if (start) start();
  }
  void SendAll() {
    for (int shard = 0; shard < shards_; ++shard) Send(shard);
  }
  // Whether some shard's start is still held.
  bool Holding() {
    absl::MutexLock lock(&mu_);
    for (const std::function<void()>& start : held_) {
      if (start) return true;
    }
    return false;
  }
  // The shards still held report `why` instead of starting.
  void Abandon(const absl::Status& why) {
    std::vector<int> abandoned;
    {
      absl::MutexLock lock(&mu_);
      for (int shard = 0; shard < shards_; ++shard) {
        if (std::exchange(held_[shard], nullptr)) abandoned.push_back(shard);
      }
    }
    for (int shard : abandoned) Done(shard, why);
  }
  void Done(int shard, absl::Status status) {
    {
      absl::MutexLock lock(&mu_);
      results_[shard] = std::move(status);
      reported_[shard] = 1;
    }
    if (on_part_) on_part_(shard);
    absl::MutexLock lock(&mu_);
    if (pending_ == 1 && on_end_) {
      mu_.Unlock();
      on_end_();
      mu_.Lock();
    }
    --pending_;
  }
  // Whether every shard reported, waiting up to `timeout`.
  bool Ended(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(
                                    +[](int* pending) { return *pending == 0; }, &pending_),
                                timeout);
  }
  // Waits up to `timeout` for shard `shard` to report; what it reported, or nullopt if it has
  // not yet.
  std::optional<absl::Status> WaitFor(int shard, absl::Duration timeout) {
    if (shard < 0 || shard >= shards_) {
      return absl::InvalidArgumentError(absl::StrCat("no shard ", shard, " in this call"));
    }
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(
            absl::Condition(
                +[](char* reported) { return *reported != 0; }, &reported_[shard]),
            timeout)) {
      return std::nullopt;
    }
    return results_[shard];
  }
  // Waits for every shard; the first failure, by shard.
  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* pending) { return *pending == 0; }, &pending_));
    for (const absl::Status& s : results_) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  const int shards_;
  const std::function<void()> on_end_;
  const std::function<void(int)> on_part_;  // told of each shard's report, once it is recorded
  absl::Mutex mu_;
  std::vector<std::function<void()>> held_ ABSL_GUARDED_BY(mu_);  // by shard: null once started
  std::vector<absl::Status> results_ ABSL_GUARDED_BY(mu_);
  std::vector<char> reported_ ABSL_GUARDED_BY(mu_);  // by shard: whether results_ holds its report
  int pending_ ABSL_GUARDED_BY(mu_);
};

// A held push's gradient as a backward pass fills it in from its end (Pending::Filled): by shard,
// the values of its range in place, counted from the range's end, which a part sending its values
// as they come waits on. Thread-safe.
class ShardedClient::PushFill {
 public:
  // `streams(shard)`: whether shard's part may start before its range is final.
  PushFill(const std::vector<Range>& ranges, std::function<bool(int)> streams)
      : ranges_(ranges),
        streams_(std::move(streams)),
        in_place_(ranges.size(), 0),
        final_at_(ranges.size(), absl::InfinitePast()) {
    for (const Range& r : ranges_) progress_.push_back(std::make_unique<FillProgress>(r.size()));
  }
  // Values [from, end) are final; returns the shards whose part may start now.
  // Nothing once stopped: the client may be gone (Close stops its fills).
  std::vector<int> From(int64_t from) {
    std::vector<int> whole, some;
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return {};
      for (size_t s = 0; s < ranges_.size(); ++s) {
        const Range& r = ranges_[s];
        const int64_t n = std::clamp<int64_t>(r.end - std::max(from, r.begin), 0, r.size());
        if (n > in_place_[s]) Add(s, n);
        if (n == r.size()) {
          whole.push_back(static_cast<int>(s));
        } else if (n > 0) {
          some.push_back(static_cast<int>(s));
        }
      }
    }
    for (int s : some) {
      if (streams_(s)) whole.push_back(s);
    }
    return whole;
  }
  // Shard `shard`'s range is final (shard < 0: every range).
  void Final(int shard) {
    absl::MutexLock lock(&mu_);
    for (size_t s = 0; s < ranges_.size(); ++s) {
      if (shard >= 0 && static_cast<size_t>(shard) != s) continue;
      if (in_place_[s] < ranges_[s].size()) Add(s, ranges_[s].size());
    }
  }
  // When shard `shard`'s range became final; InfinitePast while it is not.
  absl::Time FinalAt(int shard) {
    absl::MutexLock lock(&mu_);
    return final_at_[shard];
  }
  // No more values come (the push was dropped, or the client cancelled): waits end.
  void Stop() {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    for (const auto& p : progress_) p->Stop();
  }
  bool stopped() {
    absl::MutexLock lock(&mu_);
    return stopped_;
  }
  // Whether shard `shard`'s part will never be final: stopped before its range was.
  bool Dropped(int shard) {
    absl::MutexLock lock(&mu_);
    return stopped_ && in_place_[shard] < ranges_[shard].size();
  }
  FillProgress& progress(int shard) { return *progress_[shard]; }

 private:
  // Shard s's first n values from its range's end are in place now (n > in_place_[s]).
  void Add(size_t s, int64_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    progress_[s]->Add(n - std::exchange(in_place_[s], n));
    if (n == ranges_[s].size()) final_at_[s] = absl::Now();
  }

  const std::vector<Range> ranges_;
  const std::function<bool(int)> streams_;
  std::vector<std::unique_ptr<FillProgress>> progress_;
  absl::Mutex mu_;
  std::vector<int64_t> in_place_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> final_at_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

namespace {
// A pull's part whose attempt failed after the caller used values it had brought: not retried
// (ABORTED), which the retry loop does not take for a shard holding the pull back.
constexpr char kPulledValuesUsed[] = "ps.client.pull-used";
grpc::Status PulledValuesUsedStatus() {
  return grpc::Status(grpc::StatusCode::ABORTED,
                      "values of this shard's part were used by the time its attempt failed: "
                      "a retry would rewrite them (compute again on a new pull)",
                      kPulledValuesUsed);
}

// A held push's part dropped by this client (Pending destroyed unwaited, or a cancel) before its
// range was final: CANCELLED, which the retry loop does not take for the shard's.
constexpr char kDroppedHere[] = "ps.client.push-dropped";
grpc::Status DroppedHereStatus() {
  return grpc::Status(grpc::StatusCode::CANCELLED,
                      "the push was dropped before this shard's part was final", kDroppedHere);
}
}  // namespace

void ShardedClient::FillFrom(PushFill& fill, Call& call, int64_t from) {
  for (int shard : fill.From(from)) call.Send(shard);
}
void ShardedClient::FillFinal(PushFill* fill, int shard) {
  if (fill != nullptr) fill->Final(shard);
}
void ShardedClient::FillStop(PushFill* fill) {
  if (fill != nullptr) fill->Stop();
}

absl::Status ShardedClient::Await(Call& call) { return call.Wait(); }
bool ShardedClient::Ended(Call& call, absl::Duration timeout) { return call.Ended(timeout); }
std::optional<absl::Status> ShardedClient::AwaitPart(Call& call, int shard,
                                                     absl::Duration timeout) {
  return call.WaitFor(shard, timeout);
}
std::optional<absl::Status> ShardedClient::AwaitValues(Call& call, PullFill& fill, int64_t begin,
                                                       int64_t end, absl::Duration timeout) {
  const int64_t total = fill.ranges().empty() ? 0 : fill.ranges().back().end;
  if (begin < 0 || begin > end || end > total) {
    return absl::InvalidArgumentError(
        absl::StrCat("values [", begin, ", ", end, ") are not within the pull's ", total));
  }
  if (begin == end) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout;
  for (int shard = 0; shard < static_cast<int>(fill.ranges().size()); ++shard) {
    const Range& r = fill.ranges()[shard];
    if (r.end <= begin || end <= r.begin) continue;
    // A part comes from its start: values up to min(end, r.end) of it.
    if (fill.WaitFor(shard, std::min(end, r.end) - r.begin, deadline - absl::Now()) ==
        PullFill::Found::kInPlace) {
      continue;
    }
    std::optional<absl::Status> part = call.WaitFor(shard, deadline - absl::Now());
    if (!part.has_value() || !part->ok()) return part;
  }
  return absl::OkStatus();
}
void ShardedClient::SendPart(Call& call, int shard) { call.Send(shard); }
void ShardedClient::SendRest(Call& call) { call.SendAll(); }
void ShardedClient::Abandon(Call& call) {
  call.Abandon(absl::CancelledError("the call was dropped before this shard's part was sent"));
}

// Everything the client knows and holds: channels, sessions, the retry loop, the threads.
class ShardedClient::Impl {
 public:
  using ShardFn = std::function<grpc::Status(int shard, grpc::ClientContext*)>;
  Impl(std::vector<std::string> addresses, ModelIdentity model, int worker_id,
       ClientOptions options);

  int num_shards() const { return static_cast<int>(replicas_.size()); }

  // Starts fn(shard) for every shard, each on a CallThreads thread, retrying transient failures
  // (the one retry loop); the call reports the first error, prefixed with the shard's address.
  // `on_end`: see Call. kHeld: each shard starts at the call's Send (CancelPending and Close
  // abandon those not sent). kLastHere: returns once the last shard's part, run on this thread,
  // ended.
  // `budget_from(shard)`, if given: a time from which shard's retry budget counts when later
  // than its first attempt (a part sent as backward makes it: once backward finished it).
  std::shared_ptr<Call> Start(ShardFn fn, bool retry, absl::Duration timeout,
                              std::function<void()> on_end = nullptr, Launch launch = Launch::kNow,
                              std::function<void(int)> on_part = nullptr,
                              std::function<absl::Time(int)> budget_from = nullptr);
  absl::Status ForEachShard(ShardFn fn, bool retry, absl::Duration timeout) {
    return Start(std::move(fn), retry, timeout, nullptr, Launch::kLastHere)->Wait();
  }
  absl::Status ForEachShard(ShardFn fn) {
    return ForEachShard(std::move(fn), /*retry=*/true, options_.rpc_timeout);
  }
  // One shard's attempts of a call started in `generation`, until one succeeds or the call fails.
  absl::Status Retry(int shard, const ShardFn& fn, bool retry, absl::Duration timeout,
                     int64_t generation,
                     const std::function<absl::Time(int)>& budget_from = nullptr);
  // Runs one attempt of fn with a fresh context (deadline `timeout`, token), tracked for
  // CancelPending; CANCELLED if `generation` was cancelled already.
  grpc::Status Attempt(int shard, const ShardFn& fn, int64_t generation, absl::Duration timeout);
  // Tracks contexts in flight so that CancelPending can reach them; false if the call's
  // generation was cancelled already.
  bool Track(grpc::ClientContext* context, int64_t generation);
  void Untrack(grpc::ClientContext* context);
  // Whether this client cancelled the calls of `generation` (CancelPending, Close). A CANCELLED
  // it did not cause came from the shard: one shutting down cancels the calls it did not finish.
  bool CancelledHere(int64_t generation);
  // The generation calls started now belong to (CancelPending starts the next).
  int64_t Generation();
  v1::ModelIdentity ModelProto() const;

  // The replica of `shard` calls go to now, its stub and its address.
  int CurrentReplica(int shard) const;
  v1::ParameterServer::Stub* Stub(int shard) const;
  std::string Address(int shard) const;
  // After a transient failure at `replica` of `shard`: calls go to the other replica, if the
  // shard has one and no other thread switched already. Returns whether it switched.
  bool SwitchReplica(int shard, int replica, const grpc::Status& failure);

  // A segment of shared memory with one shard process, and this side's turn at each region: a
  // call that finds a region taken (another call of this client uses it) goes over gRPC.
  struct SharedPath {
    SharedPath(int64_t id, SharedSegment segment) : id(id), segment(std::move(segment)) {}
    const int64_t id;
    const SharedSegment segment;
    std::mutex push_mu, pull_mu;
    std::atomic<uint64_t> next_ticket{1};
  };
  // What this client knows of one shard since it last registered there.
  struct Session {
    int64_t incarnation = 0;         // this process's, at the shard
    int64_t shard_incarnation = 0;   // the shard process's
    int64_t registered_version = 0;  // the shard's, at registration
    int64_t version = 0;             // the shard's, at registration or the last pull since
    int64_t last_sequence = -1;      // this worker's last push the shard applied
    bool initialized = false;        // the shard held the model (at a registration or pull)
    std::string consistency;
    // How tensors travel: through shared memory, else over the data plane, else over gRPC.
    std::shared_ptr<SharedPath> shared;
    std::shared_ptr<DataConnection> data;
    int data_replica = 0;  // the replica `data` connects to
    // Without `data` where the shard may give one (it was refused a place, or the connection
    // failed): when to ask again (InfiniteFuture: not to, or an attempt is under way), and the
    // wait after a further failure.
    absl::Time data_retry_at = absl::InfiniteFuture();
    absl::Duration data_backoff = kDataRetryFirst;
  };
  // The first wait before a data-plane connection is asked for again; it doubles up to the last.
  static constexpr absl::Duration kDataRetryFirst = absl::Milliseconds(100);
  static constexpr absl::Duration kDataRetryLast = absl::Seconds(10);
  Session SessionOf(int shard) const;
  // The session's data-plane connection if it is with the replica calls go to now, else null.
  std::shared_ptr<DataConnection> DataOf(const Session& session, int shard) const {
    return session.data_replica == CurrentReplica(shard) ? session.data : nullptr;
  }
  // One Register call to `shard`; records the session. `resume_sequence` >= 0 when registering
  // again with a restarted shard. Fails if the shard lost the model it held before.
  grpc::Status RegisterWith(int shard, grpc::ClientContext* context, int64_t resume_sequence);
  // Registers again with `shard`, which said it restarted, unless another thread already did since
  // the session whose shard_incarnation was `stale`.
  grpc::Status Reregister(int shard, int64_t stale, int64_t generation);
  // A segment of shared memory with the process of `shard` registered as `shard_incarnation`,
  // if ClientOptions::shared_memory and it is on this host; else why not.
  absl::StatusOr<std::shared_ptr<SharedPath>> AttachTo(int shard, int64_t shard_incarnation);
  // A data-plane connection with that process, if ClientOptions::data_plane and it has one; else
  // why not.
  absl::StatusOr<std::shared_ptr<DataConnection>> ConnectTo(int shard, int64_t shard_incarnation);
  // Puts a new data-plane connection in the place of `data`, which this client ended itself
  // (a push it dropped midway); drops it (DropData) if none can be made.
  void RenewData(int shard, const std::shared_ptr<DataConnection>& data);
  // Asks `shard` for a data-plane connection again, on a thread of its own, if the session has
  // none and its retry is due (Session::data_retry_at); calls meanwhile go over gRPC.
  void RetryData(int shard);
  // After a failed attempt (`why`) to connect the data plane: whether to try again and when.
  static void ScheduleDataRetry(Session& session, const absl::Status& why);
  // What a call made on the data-plane connection `data` with `shard` that failed (`why`, not
  // the shard's answer) returns: DEADLINE_EXCEEDED if no answer came in time on a connection
  // still open, else the connection is dropped (DropData) and "data plane lost".
  grpc::Status PlaneCallFailed(int shard, const std::shared_ptr<DataConnection>& data,
                               const absl::Status& why);
  // Stops using `data` with `shard` (it failed: `why`); later calls go over gRPC.
  void DropData(int shard, const std::shared_ptr<DataConnection>& data, absl::string_view why);
  // Stops using `shared` with `shard` (it failed: `why`); later calls go over gRPC.
  void DropShared(int shard, const std::shared_ptr<SharedPath>& shared, absl::string_view why);
  // Register, Initialize and Stats of the class.
  absl::StatusOr<int64_t> Register();
  absl::StatusOr<int> Initialize(absl::Span<const float> params);
  absl::StatusOr<std::vector<v1::StatsResponse>> Stats();
  // One unary `call` with `request` to every shard, retried like the others; the answers by shard.
  template <typename Request, typename Response>
  absl::StatusOr<std::vector<Response>> CallEachShard(
      grpc::Status (v1::ParameterServer::Stub::*call)(grpc::ClientContext*, const Request&,
                                                      Response*),
      const Request& request) {
    std::vector<Response> out(num_shards());
    absl::Status s = ForEachShard([&](int shard, grpc::ClientContext* context) {
      return (Stub(shard)->*call)(context, request, &out[shard]);
    });
    if (!s.ok()) return s;
    return out;
  }
  // Sends every shard `call` (Heartbeat, Leave) with this worker's identity: one attempt each.
  template <typename Request, typename Response>
  absl::Status TellEachShard(absl::Duration timeout,
                             grpc::Status (v1::ParameterServer::Stub::*call)(grpc::ClientContext*,
                                                                             const Request&,
                                                                             Response*)) {
    return ForEachShard(
        [&](int shard, grpc::ClientContext* context) {
          Request request;
          const Session session = SessionOf(shard);
          request.set_worker_id(worker_id_);
          request.set_incarnation(session.incarnation);
          request.set_shard_incarnation(session.shard_incarnation);
          Response response;
          return (Stub(shard)->*call)(context, request, &response);
        },
        /*retry=*/false, timeout);
  }
  // One attempt at pulling shard `shard`'s range into `params`, recording what it served.
  // `seen`: told of each run of values as it is in place, where they come as a stream (over the
  // data plane or gRPC's; a run is a part of `params`).
  grpc::Status PullFrom(int shard, grpc::ClientContext* context, absl::Span<float> params,
                        int64_t after_sequence, Versions* versions, ValuesSeen seen);
  // The same, as a call on the shard's data-plane connection `data` (one that takes calls), for a
  // request PullFrom prepared.
  grpc::Status PullCall(int shard, const grpc::ClientContext& context,
                        const std::shared_ptr<DataConnection>& data, absl::Span<float> params,
                        v1::PullRequest& request, Versions* versions, ValuesSeen seen);
  // The same, compressed (ClientOptions::pull_compression), for a request PullFrom prepared.
  grpc::Status PullCompressed(int shard, grpc::ClientContext* context, absl::Span<float> params,
                              v1::PullRequest& request, Versions* versions);
  // Records what a pull of shard `shard` made as `request` served, once its values are in.
  void Pulled(int shard, const v1::PullRequest& request, Versions* versions);
  // One attempt at pushing shard `shard`'s part of `gradient`, or `compressed` (that part
  // compressed) when not null; returns the values saturated. With `fill` (a held push's), the
  // part's values may still be coming: sent as they come as a data-plane call where the shard
  // takes that, else once all of them are in (AwaitFinal).
  grpc::Status PushTo(int shard, grpc::ClientContext* context, absl::Span<const float> gradient,
                      const std::shared_ptr<const CompressedTensor>& compressed, int64_t sequence,
                      const Versions& base, v1::PushResponse* response, int64_t* saturated,
                      PushFill* fill);
  // Whether shard `shard`'s part of a push may go as its values come (Pending::Filled): over an
  // open data-plane connection that takes them last piece first, in one part, as float32,
  // uncompressed.
  bool StreamsPush(int shard) const;
  // Waits until shard `shard`'s part of `fill` is final, until the call's deadline: CANCELLED if
  // the push was dropped (or the client cancelled) meanwhile.
  static grpc::Status AwaitFinal(PushFill& fill, int shard, const grpc::ClientContext& context);

  struct Replica {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::ParameterServer::Stub> stub;
    // Initialize and Push on raw bytes: tensors go out through transport/tensor_codec.h.
    std::unique_ptr<grpc::internal::RpcMethod> initialize, push;
    // Whether a call reached it once (failures since are outages, not settings that do not
    // fit), and what the last probe found (connection_probe.h), used for 5 s.
    struct Contact {
      std::atomic<bool> reached{false};
      absl::Mutex mu;
      absl::Time probed_at ABSL_GUARDED_BY(mu) = absl::InfinitePast();
      ProbeFinding finding ABSL_GUARDED_BY(mu);
    };
    std::unique_ptr<Contact> contact = std::make_unique<Contact>();
  };
  // What probing `replica` finds, probed again only 5 s after the last probe.
  static ProbeFinding ProbeOf(const Replica& replica, const ClientSecurity& security);
  const Replica& CurrentReplicaOf(int shard) const;
  std::vector<std::vector<Replica>> replicas_;  // by shard: one, or two with replication
  std::string authorization_;                   // the metadata value every call carries; "" : none
  ModelIdentity model_;
  int worker_id_;
  ClientOptions options_;
  std::vector<Range> ranges_;                   // shard i's range of the flat vector
  // By shard: the next shard listed on the same host (its first replica's), -1: none. A
  // started pull's parts on one host go one after another, in this order.
  std::vector<int> next_on_host_;
  bool hosts_shared_ = false;                   // whether a host holds several shards
  std::unique_ptr<PushCompressor> compressor_;  // null: pushes are not compressed
  // With compressed pulls, by shard: the view of its range this client holds (its id, 0: none,
  // and values) and room for a change, one pull at a time. Empty: pulls are whole.
  struct PullView {
    absl::Mutex mu;
    uint64_t id ABSL_GUARDED_BY(mu) = 0;
    std::vector<float> values ABSL_GUARDED_BY(mu), change ABSL_GUARDED_BY(mu);
  };
  std::vector<std::unique_ptr<PullView>> views_;
  std::string consistency_;

  // One per shard: held while registering again, so that two threads noticing one restart do
  // not register twice (the second registration would supersede the first).
  std::vector<std::unique_ptr<absl::Mutex>> register_mu_;
  mutable absl::Mutex sessions_mu_;
  std::vector<Session> sessions_ ABSL_GUARDED_BY(sessions_mu_);
  std::vector<int> current_ ABSL_GUARDED_BY(sessions_mu_);  // by shard: the replica called
  int reregistrations_ ABSL_GUARDED_BY(sessions_mu_) = 0;
  // The worker's pushes and pulls as the client numbers them. Shared with the calls' results,
  // which may outlive the client.
  struct Steps {
    absl::Mutex mu;
    int64_t next ABSL_GUARDED_BY(mu) = 0;                // the next push's sequence
    int64_t last_started ABSL_GUARDED_BY(mu) = -1;       // the last push's
    std::multiset<int64_t> pushing ABSL_GUARDED_BY(mu);  // pushes in progress
    // Whether a push started since the last pull was waited for: a prefetch is then ahead of
    // that push, else of the next one.
    bool pushed_since_pull ABSL_GUARDED_BY(mu) = false;
    Versions last_pull ABSL_GUARDED_BY(mu);
    // For registering again: the push in progress (the lowest), else the next.
    int64_t Resume() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return pushing.empty() ? next : *pushing.begin();
    }
  };
  const std::shared_ptr<Steps> steps_ = std::make_shared<Steps>();

  absl::Mutex mu_;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // incremented by CancelPending
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);
  std::vector<std::weak_ptr<Call>> holding_ ABSL_GUARDED_BY(mu_);  // calls started kHeld
  std::vector<std::weak_ptr<PushFill>> fills_ ABSL_GUARDED_BY(mu_);  // their pushes' fills

  // Last: destroyed (its threads joined) before the state they use.
  CallThreads threads_;
};

ShardedClient::ShardedClient(std::vector<std::string> addresses, ModelIdentity model, int worker_id,
                             ClientOptions options)
    : impl_(std::make_unique<Impl>(std::move(addresses), std::move(model), worker_id,
                                   std::move(options))) {}

ShardedClient::~ShardedClient() { Close(); }

int ShardedClient::num_shards() const { return impl_->num_shards(); }
const ModelIdentity& ShardedClient::model() const { return impl_->model_; }
int ShardedClient::worker_id() const { return impl_->worker_id_; }
Range ShardedClient::shard_range(int shard) const { return impl_->ranges_[shard]; }
const std::string& ShardedClient::consistency() const { return impl_->consistency_; }

ShardedClient::Impl::Impl(std::vector<std::string> addresses, ModelIdentity model, int worker_id,
                          ClientOptions options)
    : model_(std::move(model)),
      worker_id_(worker_id),
      options_(std::move(options)),
      sessions_(addresses.size()),
      current_(addresses.size(), 0) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = options_.security.credentials;
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  if (!options_.security.token.empty()) authorization_ = BearerValue(options_.security.token);
  for (size_t i = 0; i < addresses.size(); ++i) {
    std::vector<Replica>& replicas = replicas_.emplace_back();
    for (const std::string& address : ShardReplicas(addresses[i])) {
      std::shared_ptr<grpc::Channel> channel =
          grpc::CreateCustomChannel(address, credentials, ShardChannelArguments());
      auto method = [&](absl::string_view name) {
        return std::make_unique<grpc::internal::RpcMethod>(
            MethodPath<v1::ParameterServer>(name), grpc::internal::RpcMethod::CLIENT_STREAMING,
            channel);
      };
      replicas.push_back({address, channel, v1::ParameterServer::NewStub(channel),
                          method("Initialize"), method("Push"),
                          std::make_unique<Replica::Contact>()});
    }
    ranges_.push_back(
        PartRange(model_.total_params, static_cast<int>(i), static_cast<int>(addresses.size())));
    register_mu_.push_back(std::make_unique<absl::Mutex>());
  }
  // Shards on this machine's own loopback address (a local cluster) share no link, nor do any
  // this client reaches through shared memory (BeginPull).
  next_on_host_.assign(addresses.size(), -1);
  std::map<std::string, int> last_on_host;
  for (size_t i = 0; i < addresses.size(); ++i) {
    std::string host, port;
    if (!SplitHostPort(replicas_[i][0].address, &host, &port)) host = replicas_[i][0].address;
    if (host == "127.0.0.1" || host == "localhost" || host == "::1") continue;
    auto [it, first] = last_on_host.try_emplace(host, static_cast<int>(i));
    if (!first) {
      next_on_host_[it->second] = static_cast<int>(i);
      it->second = static_cast<int>(i);
      hosts_shared_ = true;
    }
  }
  if (options_.compression.compressor != Compressor::kNone) {
    std::vector<int64_t> sizes;
    for (const Range& r : ranges_) sizes.push_back(r.size());
    compressor_ = std::make_unique<PushCompressor>(options_.compression, options_.error_feedback,
                                                   std::move(sizes));
  }
  if (options_.pull_compression.compressor != Compressor::kNone && worker_id_ >= 0) {
    for (size_t i = 0; i < ranges_.size(); ++i) views_.push_back(std::make_unique<PullView>());
  }
  absl::MutexLock lock(&steps_->mu);
  steps_->last_pull.version.assign(addresses.size(), 0);
  steps_->last_pull.shard_incarnation.assign(addresses.size(), 0);
}

int ShardedClient::Impl::CurrentReplica(int shard) const {
  absl::MutexLock lock(&sessions_mu_);
  return current_[shard];
}

const ShardedClient::Impl::Replica& ShardedClient::Impl::CurrentReplicaOf(int shard) const {
  return replicas_[shard][CurrentReplica(shard)];
}

v1::ParameterServer::Stub* ShardedClient::Impl::Stub(int shard) const {
  return CurrentReplicaOf(shard).stub.get();
}

std::string ShardedClient::Impl::Address(int shard) const {
  return replicas_[shard][CurrentReplica(shard)].address;
}

bool ShardedClient::Impl::SwitchReplica(int shard, int replica, const grpc::Status& failure) {
  const int count = static_cast<int>(replicas_[shard].size());
  if (count < 2) return false;
  {
    absl::MutexLock lock(&sessions_mu_);
    if (current_[shard] != replica) return false;
    current_[shard] = (replica + 1) % count;
  }
  PS_LOG(WARNING) << "shard " << shard << " (" << replicas_[shard][replica].address
                  << "): " << failure.error_message() << "; trying its other replica, "
                  << replicas_[shard][(replica + 1) % count].address;
  return true;
}

int64_t ShardedClient::Versions::Min() const {
  return version.empty() ? 0 : *std::min_element(version.begin(), version.end());
}

ShardedClient::Impl::Session ShardedClient::Impl::SessionOf(int shard) const {
  absl::MutexLock lock(&sessions_mu_);
  return sessions_[shard];
}

v1::ModelIdentity ShardedClient::Impl::ModelProto() const {
  v1::ModelIdentity m;
  m.set_fingerprint(model_.fingerprint);
  m.set_total_params(model_.total_params);
  m.set_num_shards(model_.num_shards);
  return m;
}

bool ShardedClient::Impl::Track(grpc::ClientContext* context, int64_t generation) {
  absl::MutexLock lock(&mu_);
  if (generation != generation_ || closed_) return false;
  in_flight_.insert(context);
  return true;
}

void ShardedClient::Impl::Untrack(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  in_flight_.erase(context);
}

int64_t ShardedClient::Impl::Generation() {
  absl::MutexLock lock(&mu_);
  return generation_;
}

bool ShardedClient::Impl::CancelledHere(int64_t generation) {
  absl::MutexLock lock(&mu_);
  return generation != generation_ || closed_;
}

grpc::Status ShardedClient::Impl::Attempt(
    int shard, const std::function<grpc::Status(int, grpc::ClientContext*)>& fn, int64_t generation,
    absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!authorization_.empty()) context.AddMetadata(kAuthorizationMetadata, authorization_);
  if (!Track(&context, generation)) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled at shutdown");
  }
  grpc::Status s = fn(shard, &context);
  Untrack(&context);
  return s;
}

std::shared_ptr<ShardedClient::Call> ShardedClient::Impl::Start(
    ShardFn fn, bool retry, absl::Duration timeout, std::function<void()> on_end, Launch launch,
    std::function<void(int)> on_part, std::function<absl::Time(int)> budget_from) {
  auto call = std::make_shared<Call>(num_shards(), std::move(on_end), std::move(on_part));
  int64_t generation;
  {
    absl::MutexLock lock(&mu_);
    generation = generation_;
  }
  auto shared_fn = std::make_shared<const ShardFn>(std::move(fn));
  auto shared_budget =
      std::make_shared<const std::function<absl::Time(int)>>(std::move(budget_from));
  const int here = launch == Launch::kLastHere ? num_shards() - 1 : -1;
  // Holds only a weak reference to the call: a held start must not keep its own call alive.
  std::weak_ptr<Call> weak = call;
  for (int shard = 0; shard < num_shards(); ++shard) {
    if (shard == here) continue;
    auto start = [this, shared_fn, shared_budget, shard, retry, timeout, generation, weak] {
      auto result = std::make_shared<absl::Status>();
      threads_.Run(
          [this, shared_fn, shared_budget, shard, retry, timeout, generation, result] {
            *result = Retry(shard, *shared_fn, retry, timeout, generation, *shared_budget);
          },
          [call = weak.lock(), shard, result] { call->Done(shard, std::move(*result)); });
    };
    if (launch == Launch::kHeld) {
      call->Hold(shard, std::move(start));
    } else {
      start();
    }
  }
  // Known to CancelPending once its parts are held (after a CancelPending meanwhile, its parts, of
  // an older generation, end CANCELLED as they start).
  if (launch == Launch::kHeld) {
    absl::MutexLock lock(&mu_);
    holding_.erase(std::remove_if(holding_.begin(), holding_.end(),
                                  [](const std::weak_ptr<Call>& c) {
                                    std::shared_ptr<Call> held = c.lock();
                                    return held == nullptr || !held->Holding();
                                  }),
                   holding_.end());
    holding_.push_back(call);
  }
  if (here >= 0) {
    call->Done(here, Retry(here, *shared_fn, retry, timeout, generation, *shared_budget));
  }
  return call;
}

absl::Status ShardedClient::Impl::Retry(int shard, const ShardFn& fn, bool retry,
                                        absl::Duration timeout, int64_t generation,
                                        const std::function<absl::Time(int)>& budget_from) {
  // Waits up to `d`; true if CancelPending was called meanwhile.
  auto cancelled_within = [&](absl::Duration d) {
    absl::MutexLock lock(&mu_);
    auto changed = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return generation_ != generation; };
    return mu_.AwaitWithTimeout(absl::Condition(&changed), d);
  };
  const absl::Time start = absl::Now();
  absl::Time give_up = start + options_.retry_for;
  absl::Duration backoff = absl::Milliseconds(50);
  // What a probe found about a replica this client has not reached yet (connection_probe.h).
  std::optional<ProbeFinding> probed;
  // A shard that keeps saying it restarted after we registered again is not one we can use.
  // With two replicas, a failure is tried at the other at once, then again after the backoff.
  bool switched_at_once = false;
  for (int reregistered = 0, path_lost = 0;;) {
    const int64_t shard_incarnation = SessionOf(shard).shard_incarnation;
    const int replica = CurrentReplica(shard);
    grpc::Status s = Attempt(shard, fn, generation, timeout);
    if (IsShardRestarted(s) && reregistered++ < 3) {
      PS_LOG(WARNING) << "shard " << shard << " (" << Address(shard)
                      << ") is another process than the one this client registered with: "
                         "registering again";
      s = Reregister(shard, shard_incarnation, generation);
      if (s.ok()) continue;
    }
    // The call's shared memory or data plane failed (and was dropped): the tensor goes over gRPC
    // at once.
    if ((IsSharedMemoryLost(s) || IsDataPlaneLost(s)) && path_lost++ < 2) continue;
    const Replica& called = replicas_[shard][replica];
    if (s.ok()) {
      called.contact->reached.store(true, std::memory_order_relaxed);
      return absl::OkStatus();
    }
    if (budget_from) give_up = std::max(give_up, budget_from(shard) + options_.retry_for);
    // Could not connect, and never reached: the TLS settings may not fit, which no retry heals.
    const bool not_connected =
        (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::UNKNOWN ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) &&
        called.channel->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY;
    // A mismatch ends the call at once, naming it.
    if (!probed && not_connected && !called.contact->reached.load(std::memory_order_relaxed)) {
      probed = ProbeOf(called, options_.security);
      if (probed->misconfigured) {
        return absl::FailedPreconditionError(absl::StrCat("shard ", shard, " (", called.address,
                                                          "): ", probed->cause,
                                                          " [gRPC: ", s.error_message(), "]"));
      }
    }
    // A shard's CANCELLED (it is shutting down: a restart, a fenced primary) is as transient as
    // UNAVAILABLE; a push sent again is applied once whatever the first attempt did.
    const bool cancelled = s.error_code() == grpc::StatusCode::CANCELLED &&
                           (CancelledHere(generation) || s.error_details() == kDroppedHere);
    const bool transient =
        IsTransient(s) || (s.error_code() == grpc::StatusCode::CANCELLED && !cancelled);
    if (retry && !cancelled && s.error_code() == grpc::StatusCode::ABORTED &&
        s.error_details() != kPulledValuesUsed) {
      // Held back (a barrier, the SSP bound; bounded by the shard's progress timeout): the
      // shard is alive and waiting is the protocol, so ask again at once without spending the
      // retry budget.
      give_up = absl::Now() + options_.retry_for;
      continue;
    }
    // A call that is not retried (a heartbeat) leaves the choice to those that are; a busy
    // replica (RESOURCE_EXHAUSTED) is alive and serving.
    const bool switched = retry && transient &&
                          s.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED &&
                          SwitchReplica(shard, replica, s);
    if (switched && !switched_at_once && absl::Now() < give_up) {
      switched_at_once = true;
      continue;
    }
    switched_at_once = false;
    // The backoff; cut short (to at least 50 ms) when the shard's channel, down meanwhile,
    // connects again: a shard back from a restart is used at once. Checked for cancellation every
    // 50 ms. True if the call was cancelled meanwhile.
    auto wait = [&] {
      grpc::Channel& channel = *replicas_[shard][CurrentReplica(shard)].channel;
      if (channel.GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY) {
        return cancelled_within(backoff);
      }
      const absl::Duration slice = absl::Milliseconds(50);
      for (absl::Time end = absl::Now() + backoff; absl::Now() < end;) {
        if (cancelled_within(absl::ZeroDuration())) return true;
        if (channel.WaitForConnected(absl::ToChronoTime(std::min(end, absl::Now() + slice)))) {
          return cancelled_within(slice);  // a shard that drops every call is not hammered
        }
      }
      return cancelled_within(absl::ZeroDuration());
    };
    if (!retry || !transient || absl::Now() + backoff > give_up || wait()) {
      // A call that kept failing says for how long, and what the probe found.
      const std::string tried =
          retry && transient && absl::Now() + backoff > give_up
              ? absl::StrCat(
                    " (still failing after ",
                    absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(100))),
                    " of retries; the client's limit: --retry_seconds)")
              : "";
      // What the probe found explains this failure only if it is still one to connect.
      const bool found = probed && !probed->cause.empty() && not_connected;
      return absl::Status(
          FromGrpcStatus(s).code(),
          absl::StrCat("shard ", shard, " (", called.address,
                       "): ", found ? probed->cause : s.error_message(), tried,
                       found ? absl::StrCat(" [gRPC: ", s.error_message(), "]") : ""));
    }
    PS_LOG(WARNING) << "shard " << shard << " (" << replicas_[shard][replica].address
                    << "): " << s.error_message() << "; retried after " << backoff;
    // At most kMaxReconnectBackoffMs apart, like the channel's own attempts: a shard back from a
    // restart is used within about a second.
    backoff = std::min(backoff * 2, absl::Milliseconds(kMaxReconnectBackoffMs));
  }
}

ProbeFinding ShardedClient::Impl::ProbeOf(const Replica& replica, const ClientSecurity& security) {
  Replica::Contact& c = *replica.contact;
  {
    absl::MutexLock lock(&c.mu);
    if (absl::Now() - c.probed_at < absl::Seconds(5)) return c.finding;
  }
  // Calls that meet the same replica meanwhile may probe it too: a few probes, no lock held.
  ProbeFinding finding = ProbeShard(replica.address, security);
  absl::MutexLock lock(&c.mu);
  c.probed_at = absl::Now();
  c.finding = finding;
  return finding;
}

grpc::Status ShardedClient::Impl::RegisterWith(int shard, grpc::ClientContext* context,
                                               int64_t resume_sequence) {
  const int replica = CurrentReplica(shard);
  v1::RegisterRequest request;
  request.set_worker_id(worker_id_);
  *request.mutable_model() = ModelProto();
  if (resume_sequence >= 0) request.set_resume_sequence(resume_sequence);
  request.set_num_workers(options_.num_workers);
  v1::RegisterResponse response;
  grpc::Status status = Stub(shard)->Register(context, request, &response);
  if (!status.ok()) return status;
  if (response.shard_index() != shard) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("this address serves shard ", response.shard_index(),
                                     ", listed as shard ", shard, " in --ps"));
  }
  // Shared memory with a shard on this host, else the data plane, else gRPC.
  absl::StatusOr<std::shared_ptr<SharedPath>> shared =
      AttachTo(shard, response.shard_incarnation());
  absl::StatusOr<std::shared_ptr<DataConnection>> data =
      shared.ok() ? nullptr : ConnectTo(shard, response.shard_incarnation());
  PS_LOG(INFO) << "shard " << shard << " (" << Address(shard) << "): tensors "
               << (shared.ok() ? "through shared memory"
                   : data.ok()
                       ? "over the data plane"
                       : absl::StrCat("over gRPC (no shared memory: ", shared.status().message(),
                                      "; no data plane: ", data.status().message(), ")"));
  absl::MutexLock lock(&sessions_mu_);
  Session& session = sessions_[shard];
  if (session.initialized && !response.initialized()) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("shard ", shard,
                     " restarted without the model it held (it had reached "
                     "version ",
                     session.version, "); the job cannot go on without it. ", kLostModelFix));
  }
  session = Session{response.incarnation(),      response.shard_incarnation(),
                    response.version(),          response.version(),
                    response.last_sequence(),    response.initialized() || session.initialized,
                    response.consistency(),      shared.ok() ? *shared : nullptr,
                    data.ok() ? *data : nullptr, replica};
  if (!shared.ok() && !data.ok()) ScheduleDataRetry(session, data.status());
  return grpc::Status::OK;
}

absl::StatusOr<std::shared_ptr<ShardedClient::Impl::SharedPath>> ShardedClient::Impl::AttachTo(
    int shard, int64_t shard_incarnation) {
  if (!options_.shared_memory) return absl::FailedPreconditionError("off");
  if (ProcessSpaceId().empty()) return absl::FailedPreconditionError("no process space id");
  v1::AttachSharedMemoryRequest request;
  request.set_worker_id(worker_id_);
  *request.mutable_model() = ModelProto();
  request.set_process_space(ProcessSpaceId());
  request.set_shard_incarnation(shard_incarnation);
  v1::AttachSharedMemoryResponse response;
  // One attempt, cancelled with the others (CancelPending); a failure only means another path.
  absl::Status why = FromGrpcStatus(Attempt(
      shard,
      [&](int i, grpc::ClientContext* context) {
        return Stub(i)->AttachSharedMemory(context, request, &response);
      },
      Generation(), options_.rpc_timeout));
  if (!why.ok()) return why;
  if (response.region_bytes() < ranges_[shard].size() * WireBytes(WireType::kFloat32)) {
    return absl::FailedPreconditionError("its segment is smaller than its range");
  }
  absl::StatusOr<SharedSegment> segment =
      SharedSegment::Open(response.pid(), response.fd(), response.nonce(), response.region_bytes());
  if (!segment.ok()) return segment.status();
  return std::make_shared<SharedPath>(response.segment(), *std::move(segment));
}

absl::StatusOr<std::shared_ptr<DataConnection>> ShardedClient::Impl::ConnectTo(
    int shard, int64_t shard_incarnation) {
  if (!options_.data_plane) return absl::FailedPreconditionError("off");
  v1::AttachDataPlaneRequest request;
  request.set_worker_id(worker_id_);
  *request.mutable_model() = ModelProto();
  request.set_shard_incarnation(shard_incarnation);
  v1::AttachDataPlaneResponse response;
  absl::Status why = FromGrpcStatus(Attempt(
      shard,
      [&](int i, grpc::ClientContext* context) {
        return Stub(i)->AttachDataPlane(context, request, &response);
      },
      Generation(), options_.rpc_timeout));
  if (!why.ok()) return why;
  std::string host, port;
  SplitHostPort(Address(shard), &host, &port);
  absl::StatusOr<std::unique_ptr<DataConnection>> connection =
      DataConnection::Open({host, response.port(), response.connection(), response.secret(),
                            std::max(response.lanes(), 1), response.calls(),
                            options_.security.plane_tls, response.last_piece_first()},
                           static_cast<uint64_t>(ranges_[shard].size()) * sizeof(float),
                           absl::Now() + options_.rpc_timeout, options_.rpc_timeout);
  if (!connection.ok()) return connection.status();
  return std::shared_ptr<DataConnection>(*std::move(connection));
}

grpc::Status ShardedClient::Impl::PlaneCallFailed(int shard,
                                                  const std::shared_ptr<DataConnection>& data,
                                                  const absl::Status& why) {
  // No answer in time on a connection still open: the shard may just be slow (the answer, if it
  // comes, is dropped); a retry is made as after any deadline.
  if (why.code() == absl::StatusCode::kDeadlineExceeded && !data->ended()) {
    return ToGrpcStatus(why);
  }
  DropData(shard, data, why.message());
  return DataPlaneLostStatus(std::string(why.message()));
}

void ShardedClient::Impl::DropData(int shard, const std::shared_ptr<DataConnection>& data,
                                   absl::string_view why) {
  {
    absl::MutexLock lock(&sessions_mu_);
    Session& session = sessions_[shard];
    if (session.data != data) return;  // dropped or replaced already
    session.data = nullptr;
    ScheduleDataRetry(session, absl::UnavailableError(why));
  }
  PS_LOG(WARNING) << "shard " << shard << " (" << Address(shard)
                  << "): the data plane stopped working (" << why
                  << "); its tensors go over gRPC until a new connection is made";
}

void ShardedClient::Impl::ScheduleDataRetry(Session& session, const absl::Status& why) {
  // Off here, absent there, or a shard of another version: asking again changes nothing.
  const absl::StatusCode code = why.code();
  if (code == absl::StatusCode::kFailedPrecondition || code == absl::StatusCode::kUnimplemented ||
      code == absl::StatusCode::kInvalidArgument) {
    session.data_retry_at = absl::InfiniteFuture();
    return;
  }
  session.data_retry_at = absl::Now() + session.data_backoff;
  session.data_backoff = std::min(2 * session.data_backoff, kDataRetryLast);
}

void ShardedClient::Impl::RetryData(int shard) {
  int64_t shard_incarnation = 0;
  int replica = 0;
  {
    absl::MutexLock lock(&sessions_mu_);
    Session& session = sessions_[shard];
    if (session.data != nullptr || absl::Now() < session.data_retry_at) return;
    session.data_retry_at = absl::InfiniteFuture();  // this attempt's; the next set when it ends
    shard_incarnation = session.shard_incarnation;
    replica = current_[shard];
  }
  threads_.Run(
      [this, shard, shard_incarnation, replica] {
        absl::StatusOr<std::shared_ptr<DataConnection>> fresh = ConnectTo(shard, shard_incarnation);
        {
          absl::MutexLock lock(&sessions_mu_);
          Session& session = sessions_[shard];
          if (session.shard_incarnation != shard_incarnation || session.data != nullptr ||
              current_[shard] != replica) {
            return;  // registered again meanwhile, or another replica: that session decides
          }
          if (!fresh.ok()) {
            ScheduleDataRetry(session, fresh.status());
            return;
          }
          session.data = *std::move(fresh);
          session.data_replica = replica;
          session.data_backoff = kDataRetryFirst;
        }
        PS_LOG(INFO) << "shard " << shard << " (" << Address(shard)
                     << "): tensors over the data plane again";
      },
      [] {});
}

void ShardedClient::Impl::RenewData(int shard, const std::shared_ptr<DataConnection>& data) {
  absl::StatusOr<std::shared_ptr<DataConnection>> fresh =
      ConnectTo(shard, SessionOf(shard).shard_incarnation);
  if (!fresh.ok()) {
    DropData(shard, data, fresh.status().message());
    return;
  }
  absl::MutexLock lock(&sessions_mu_);
  if (sessions_[shard].data == data) sessions_[shard].data = *std::move(fresh);
}

void ShardedClient::Impl::DropShared(int shard, const std::shared_ptr<SharedPath>& shared,
                                     absl::string_view why) {
  {
    absl::MutexLock lock(&sessions_mu_);
    if (sessions_[shard].shared != shared) return;  // dropped or replaced already
    sessions_[shard].shared = nullptr;
  }
  PS_LOG(WARNING) << "shard " << shard << " (" << Address(shard)
                  << "): shared memory stopped working (" << why
                  << "); its tensors go over gRPC from now on";
}

grpc::Status ShardedClient::Impl::Reregister(int shard, int64_t stale, int64_t generation) {
  absl::MutexLock registering(register_mu_[shard].get());
  int64_t resume_sequence = -1;
  {
    absl::MutexLock lock(&sessions_mu_);
    if (sessions_[shard].shard_incarnation != stale) return grpc::Status::OK;  // done already
  }
  if (worker_id_ >= 0) {
    absl::MutexLock lock(&steps_->mu);
    resume_sequence = steps_->Resume();
  }
  grpc::Status s = Attempt(
      shard,
      [&](int i, grpc::ClientContext* context) {
        return RegisterWith(i, context, resume_sequence);
      },
      generation, options_.rpc_timeout);
  if (s.ok()) {
    const std::string address = Address(shard);
    absl::MutexLock lock(&sessions_mu_);
    ++reregistrations_;
    PS_LOG(INFO) << "registered again with shard " << shard << " (" << address
                 << "), now at version " << sessions_[shard].version;
  }
  return s;
}

CancelOnShutdown::CancelOnShutdown(ShardedClient* client)
    : thread_([client] {
        WaitForShutdown(absl::InfiniteDuration());
        client->CancelPending();
      }) {}

void CancelOnShutdown::Join() {
  if (!thread_.joinable()) return;
  RequestShutdown();
  thread_.join();
}

absl::StatusOr<int64_t> ShardedClient::Impl::Register() {
  if (model_.num_shards != num_shards()) {
    return absl::InvalidArgumentError(absl::StrCat("model expects ", model_.num_shards, " shards, ",
                                                   num_shards(), " addresses given"));
  }
  std::vector<bool> ask(num_shards(), true);
  for (int pass = 0;; ++pass) {
    absl::Status s = ForEachShard([&](int shard, grpc::ClientContext* context) {
      return ask[shard] ? RegisterWith(shard, context, /*resume_sequence=*/-1) : grpc::Status::OK;
    });
    if (!s.ok()) return s;
    // Shards without the model beside trained ones: some shard lost its state (a restart without
    // its checkpoints). Initialising it would silently reset part of the model. Or this client
    // asked them before the job's first worker initialised them, and the others once it had
    // trained: those are asked once more (one that lost its model still has none).
    absl::MutexLock lock(&sessions_mu_);
    int64_t trained = 0;
    std::vector<int> empty;
    for (int i = 0; i < num_shards(); ++i) {
      if (!sessions_[i].initialized) empty.push_back(i);
      trained = std::max(trained, sessions_[i].version);
      ask[i] = !sessions_[i].initialized;
    }
    if (empty.empty() || trained == 0) break;
    if (pass > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard(s) ", absl::StrJoin(empty, ","),
                       " hold no model while the others are trained (up "
                       "to version ",
                       trained, "): a shard restarted without its checkpoints. ", kLostModelFix));
    }
  }
  absl::MutexLock lock(&sessions_mu_);
  consistency_ = sessions_[0].consistency;
  std::vector<int64_t> last;
  for (const Session& session : sessions_) last.push_back(session.last_sequence);
  // In rounds (sync, local) a step that reached only some shards is not sent again: its round has
  // closed (the others would drop it as late), and a duplicate on one shard with a contribution
  // on another would put this worker in different rounds on different shards, which deadlocks the
  // barrier.
  absl::StatusOr<ConsistencySpec> spec = ParseConsistencySpec(consistency_);
  const bool rounds = spec.ok() && spec->rounds();
  const int64_t next = (rounds ? *std::max_element(last.begin(), last.end())
                               : *std::min_element(last.begin(), last.end())) +
                       1;
  absl::MutexLock steps_lock(&steps_->mu);
  steps_->next = next;
  return next;
}

absl::StatusOr<int> ShardedClient::Impl::Initialize(absl::Span<const float> params) {
  std::vector<int> applied(num_shards(), 0);
  absl::Status s = ForEachShard([&](int shard, grpc::ClientContext* context) {
    const Range& r = ranges_[shard];
    v1::InitializeChunk first;
    v1::InitializeHeader* header = first.mutable_header();
    *header->mutable_model() = ModelProto();
    header->set_offset(r.begin);
    header->set_length(r.size());
    header->set_dtype(v1::FLOAT32);
    v1::InitializeResponse response;
    const Replica& replica = CurrentReplicaOf(shard);
    std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
            replica.channel.get(), *replica.initialize, context, &response));
    WriteTensorChunks(writer.get(), first, params.subspan(r.begin, r.size()), WireType::kFloat32);
    writer->WritesDone();
    grpc::Status status = writer->Finish();
    applied[shard] = response.applied();
    return status;
  });
  if (!s.ok()) return s;
  return static_cast<int>(std::count(applied.begin(), applied.end(), 1));
}

grpc::Status ShardedClient::Impl::PullFrom(int shard, grpc::ClientContext* context,
                                           absl::Span<float> params, int64_t after_sequence,
                                           Versions* versions, ValuesSeen seen) {
  const Range& r = ranges_[shard];
  RetryData(shard);
  const Session session = SessionOf(shard);
  v1::PullRequest request;
  request.set_offset(r.begin);
  request.set_length(r.size());
  request.set_worker_id(worker_id_);
  if (after_sequence >= 0) request.set_after_sequence(after_sequence);
  request.set_shard_incarnation(session.shard_incarnation);
  request.set_dtype(static_cast<v1::DType>(options_.pull_type));
  *request.mutable_model() = ModelProto();
  if (!views_.empty()) return PullCompressed(shard, context, params, request, versions);
  // Through shared memory if there is a segment and no other pull of this client uses it.
  const std::shared_ptr<SharedPath>& shared = session.shared;
  std::unique_lock<std::mutex> turn;
  if (shared != nullptr) turn = std::unique_lock<std::mutex>(shared->pull_mu, std::try_to_lock);
  uint64_t ticket = 0;
  if (turn.owns_lock()) {
    ticket = shared->next_ticket++;
    if (!shared->segment.pull().Claim(SharedRegion::kReady, ticket, ClaimDeadline(*context))) {
      DropShared(shard, shared, "its pull region stayed busy");
      return SharedMemoryLostStatus("shared pull region busy");
    }
    request.set_shm_segment(shared->id);
    request.set_shm_ticket(ticket);
  }
  // Else over the data plane, if there is a connection: the values go straight into `params`.
  const std::shared_ptr<DataConnection> data = DataOf(session, shard);
  if (!turn.owns_lock() && data != nullptr && data->calls()) {
    return PullCall(shard, *context, data, params, request, versions, seen);
  }
  uint64_t transfer = 0;
  if (!turn.owns_lock() && data != nullptr) {
    transfer = data->NextTransfer();
    if (data->Expect(transfer, params.subspan(r.begin, r.size()), options_.pull_type, seen).ok()) {
      request.set_data_connection(data->id());
      request.set_data_transfer(transfer);
    } else {
      transfer = 0;
    }
  }
  auto reader = Stub(shard)->Pull(context, request);
  ChunkAssembler assembler(params.subspan(r.begin, r.size()), options_.pull_type);
  v1::PullChunk chunk;
  absl::Status bad;
  for (bool first = true; reader->Read(&chunk); first = false) {
    if (first) versions->version[shard] = chunk.version();
    if (!bad.ok()) continue;  // drain the stream so Finish() returns
    if (chunk.dtype() != request.dtype()) {
      bad = absl::DataLossError(absl::StrCat("asked for dtype ", request.dtype(), ", got ",
                                             chunk.dtype(), " (an older shard?)"));
    } else if (chunk.offset() != r.begin + assembler.received()) {
      bad = absl::DataLossError(absl::StrCat("chunk at offset ", chunk.offset(), ", expected ",
                                             r.begin + assembler.received()));
    } else if (ticket != 0) {
      if (!first || !chunk.data().empty() || chunk.shm_values() != r.size()) {
        bad = absl::DataLossError("a pull through shared memory is one chunk naming the values");
      }
    } else if (transfer != 0) {
      if (!first || !chunk.data().empty() || chunk.data_values() != r.size()) {
        bad = absl::DataLossError("a pull over the data plane is one chunk naming the values");
      }
    } else {
      const int64_t before = assembler.received();
      bad = assembler.Append(chunk.data());
      if (bad.ok()) {
        seen(params.subspan(r.begin + before, assembler.received() - before));
      }
    }
  }
  grpc::Status status = reader->Finish();
  if (IsSharedMemoryLost(status)) DropShared(shard, shared, status.error_message());
  if (transfer != 0) {
    // The values were written before the answer: they are here or on their way. A call that
    // failed forgets its transfer at once.
    const bool answered = status.ok() && bad.ok();
    absl::Status arrived =
        data->Await(transfer, params.subspan(r.begin, r.size()), options_.pull_type,
                    answered ? absl::FromChrono(context->deadline()) : absl::InfinitePast());
    if (IsDataPlaneLost(status)) DropData(shard, data, status.error_message());
    if (answered && !arrived.ok()) {
      DropData(shard, data, arrived.message());
      return DataPlaneLostStatus(std::string(arrived.message()));
    }
  }
  if (status.ok() && bad.ok() && ticket != 0) {
    SharedRegion region = shared->segment.pull();
    if (!region.Move(SharedRegion::kFilled, SharedRegion::kBusy, ticket)) {
      DropShared(shard, shared, "its pull region did not hold the values");
      return SharedMemoryLostStatus("shared pull region not filled");
    }
    bad = assembler.Append(std::string_view(region.data(), r.size() * assembler.element_bytes()));
    region.Move(SharedRegion::kBusy, SharedRegion::kIdle, ticket);
  }
  if (status.ok() && bad.ok() && transfer == 0) bad = assembler.Finish();
  if (!status.ok() || !bad.ok()) return status.ok() ? ToGrpcStatus(bad) : status;
  Pulled(shard, request, versions);
  return grpc::Status::OK;
}

grpc::Status ShardedClient::Impl::PullCall(int shard, const grpc::ClientContext& context,
                                           const std::shared_ptr<DataConnection>& data,
                                           absl::Span<float> params, v1::PullRequest& request,
                                           Versions* versions, ValuesSeen seen) {
  const Range& r = ranges_[shard];
  const uint64_t transfer = data->NextTransfer();
  request.set_data_connection(data->id());
  request.set_data_transfer(transfer);
  absl::StatusOr<DataConnection::Answered> made =
      data->PullCall(transfer, request.SerializeAsString(), params.subspan(r.begin, r.size()),
                     options_.pull_type, absl::FromChrono(context.deadline()), seen);
  if (!made.ok()) return PlaneCallFailed(shard, data, made.status());
  if (IsDataPlaneLost(made->status)) DropData(shard, data, made->status.error_message());
  if (!made->status.ok()) return made->status;
  v1::PullChunk head;
  if (!head.ParseFromString(made->response) || head.dtype() != request.dtype() ||
      head.offset() != r.begin || head.data_values() != r.size()) {
    return grpc::Status(
        grpc::StatusCode::DATA_LOSS,
        "the shard's answer to a pull on the data plane is not the values asked for");
  }
  versions->version[shard] = head.version();
  Pulled(shard, request, versions);
  return grpc::Status::OK;
}

grpc::Status ShardedClient::Impl::PullCompressed(int shard, grpc::ClientContext* context,
                                                 absl::Span<float> params,
                                                 v1::PullRequest& request, Versions* versions) {
  const Range& r = ranges_[shard];
  PullView& view = *views_[shard];
  absl::MutexLock view_lock(&view.mu);
  // Whatever this attempt ends in, the view it names is used up: the shard moves on from it.
  const uint64_t held = std::exchange(view.id, 0);
  request.set_compress(static_cast<v1::DType>(options_.pull_compression.compressor));
  request.set_topk_fraction(options_.pull_compression.topk_fraction);
  request.set_view(held);
  view.values.resize(r.size());
  auto reader = Stub(shard)->Pull(context, request);
  std::optional<ChunkAssembler> assembler;
  v1::PullChunk first;
  v1::PullChunk chunk;
  absl::Status bad;
  for (bool is_first = true; reader->Read(&chunk); is_first = false) {
    if (is_first) {
      first = chunk;
      first.clear_data();
      versions->version[shard] = chunk.version();
      if (chunk.base_view() == 0) {  // the whole values
        if (chunk.dtype() != request.dtype()) {
          bad = absl::DataLossError(absl::StrCat("asked for dtype ", request.dtype(), ", got ",
                                                 chunk.dtype(), " (an older shard?)"));
        } else {
          assembler.emplace(absl::MakeSpan(view.values), options_.pull_type);
        }
      } else if (chunk.base_view() != held || chunk.dtype() != request.compress()) {
        bad = absl::DataLossError("a compressed pull's change is not to the view it named");
      } else {
        absl::StatusOr<PayloadFormat> format =
            PushPayloadFormat(chunk.dtype(), chunk.topk_pairs(), r.size());
        bad = format.status();
        view.change.resize(r.size());
        if (bad.ok()) assembler.emplace(absl::MakeSpan(view.change), *format);
      }
    }
    if (!bad.ok()) continue;  // drain the stream so Finish() returns
    if (chunk.view() != first.view() || chunk.base_view() != first.base_view() ||
        chunk.topk_pairs() != first.topk_pairs() || chunk.dtype() != first.dtype() ||
        (first.base_view() == 0 && chunk.offset() != r.begin + assembler->received())) {
      bad = absl::DataLossError("a compressed pull's chunks disagree");
    } else {
      bad = assembler->Append(chunk.data());
    }
  }
  grpc::Status status = reader->Finish();
  if (status.ok() && bad.ok()) {
    bad = assembler.has_value() ? assembler->Finish() : absl::DataLossError("an empty answer");
  }
  if (!status.ok() || !bad.ok()) return status.ok() ? ToGrpcStatus(bad) : status;
  if (first.base_view() != 0) {  // as the shard adds it to its copy of the view, bit for bit
    for (int64_t i = 0; i < r.size(); ++i) view.values[i] += view.change[i];
  }
  std::copy(view.values.begin(), view.values.end(), params.begin() + r.begin);
  view.id = first.view();
  Pulled(shard, request, versions);
  return grpc::Status::OK;
}

void ShardedClient::Impl::Pulled(int shard, const v1::PullRequest& request, Versions* versions) {
  versions->shard_incarnation[shard] = request.shard_incarnation();
  absl::MutexLock lock(&sessions_mu_);
  Session& now = sessions_[shard];
  if (now.shard_incarnation == request.shard_incarnation()) {
    now.initialized = true;
    now.version = std::max(now.version, versions->version[shard]);
  }
}

ShardedClient::Pending<ShardedClient::Versions> ShardedClient::StartPull(absl::Span<float> params,
                                                                         bool prefetch) {
  return BeginPull(params, prefetch, Launch::kNow);
}

absl::StatusOr<ShardedClient::Versions> ShardedClient::Pull(absl::Span<float> params) {
  return BeginPull(params, /*prefetch=*/false, Launch::kLastHere).Wait();
}

ShardedClient::Pending<ShardedClient::Versions> ShardedClient::BeginPull(absl::Span<float> params,
                                                                         bool prefetch,
                                                                         Launch launch) {
  auto versions = std::make_shared<Versions>();
  versions->version.assign(num_shards(), 0);
  versions->shard_incarnation.assign(num_shards(), 0);
  Impl* impl = impl_.get();
  std::shared_ptr<Impl::Steps> steps = impl->steps_;
  int64_t after_sequence = -1;
  if (prefetch) {
    absl::MutexLock lock(&steps->mu);
    after_sequence = steps->pushed_since_pull ? steps->last_started : steps->next;
  }
  auto fill = std::make_shared<PullFill>(impl->ranges_);
  // A pull started to be used as it arrives, where hosts hold several shards: each host's parts
  // go one after another in the flat order (the others held until the one before ends), so that
  // the first values come first at every host's full rate. Otherwise every part starts at once,
  // a prefetch too: it runs while this step's push goes out on the same links, and in order its
  // later parts came too late (steps 1.4-1.5x as long: bench/RESULTS.md "Shards spread over
  // hosts").
  bool in_order = launch == Launch::kNow && !prefetch && impl->hosts_shared_;
  for (int shard = 0; in_order && shard < num_shards(); ++shard) {
    in_order = impl->SessionOf(shard).shared == nullptr;  // shared memory: this machine, no link
  }
  struct Started {  // the call, once Start returned (a part may end on another thread before)
    absl::Mutex mu;
    std::weak_ptr<Call> call ABSL_GUARDED_BY(mu);
  };
  auto started = std::make_shared<Started>();
  std::shared_ptr<Call> call = impl->Start(
      [impl, params, after_sequence, versions, fill](int shard, grpc::ClientContext* context) {
        if (!fill->Attempt(shard)) return PulledValuesUsedStatus();
        const float* part = params.data() + impl->ranges_[shard].begin;
        auto in_place = [&](absl::Span<const float> run) {
          fill->InPlace(shard, run.data() - part, static_cast<int64_t>(run.size()));
        };
        grpc::Status s =
            impl->PullFrom(shard, context, params, after_sequence, versions.get(), in_place);
        if (!s.ok()) fill->Failed(shard);
        return s;
      },
      /*retry=*/true, impl->options_.rpc_timeout, nullptr, in_order ? Launch::kHeld : launch,
      [fill, started, next = impl->next_on_host_](int shard) {
        fill->Ended(shard);
        std::shared_ptr<Call> c;
        {
          absl::MutexLock lock(&started->mu);
          c = started->call.lock();
        }
        if (c != nullptr) c->Send(next[shard]);
      });
  if (in_order) {
    {
      absl::MutexLock lock(&started->mu);
      started->call = call;
    }
    std::vector<bool> later(num_shards(), false);
    for (int next : impl->next_on_host_) {
      if (next >= 0) later[next] = true;
    }
    for (int shard = 0; shard < num_shards(); ++shard) {
      if (!later[shard]) call->Send(shard);
    }
  }
  return Pending<Versions>(
      std::move(call),
      [versions, steps] {
        absl::MutexLock lock(&steps->mu);
        steps->last_pull = *versions;
        steps->pushed_since_pull = false;
        return *versions;
      },
      nullptr, std::move(fill));
}

ShardedClient::Versions ShardedClient::last_pull() const {
  absl::MutexLock lock(&impl_->steps_->mu);
  return impl_->steps_->last_pull;
}

bool ShardedClient::Impl::StreamsPush(int shard) const {
  if (compressor_ != nullptr || options_.push_type != WireType::kFloat32) return false;
  const Session session = SessionOf(shard);
  const std::shared_ptr<DataConnection> data = DataOf(session, shard);
  return session.shared == nullptr && data != nullptr && !data->ended() &&
         data->last_piece_first() &&
         StripeCount(ranges_[shard].size(), WireType::kFloat32, data->lanes()) == 1;
}

grpc::Status ShardedClient::Impl::AwaitFinal(PushFill& fill, int shard,
                                             const grpc::ClientContext& context) {
  FillProgress& progress = fill.progress(shard);
  if (progress.WaitFor(progress.total(), absl::FromChrono(context.deadline())) >=
      progress.total()) {
    return grpc::Status::OK;
  }
  if (fill.stopped()) return DroppedHereStatus();
  return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                      "this shard's part of the gradient was not final by the call's deadline");
}

grpc::Status ShardedClient::Impl::PushTo(int shard, grpc::ClientContext* context,
                                         absl::Span<const float> gradient,
                                         const std::shared_ptr<const CompressedTensor>& compressed,
                                         int64_t sequence, const Versions& base,
                                         v1::PushResponse* response, int64_t* saturated,
                                         PushFill* fill) {
  const Range& r = ranges_[shard];
  RetryData(shard);
  const Session session = SessionOf(shard);
  int64_t base_version = base.version[shard];
  if (base.shard_incarnation[shard] != 0 &&
      base.shard_incarnation[shard] != session.shard_incarnation) {
    // Computed from an earlier process of this shard, whose updates since its checkpoint are
    // lost: the gradient is taken as computed from the version the shard came back at.
    base_version = std::min(base_version, session.registered_version);
  }
  v1::PushChunk first;
  v1::PushHeader& header = *first.mutable_header();
  header.set_worker_id(worker_id_);
  header.set_incarnation(session.incarnation);
  header.set_shard_incarnation(session.shard_incarnation);
  header.set_sequence(sequence);
  header.set_base_version(base_version);
  header.set_offset(r.begin);
  header.set_length(r.size());
  header.set_dtype(static_cast<v1::DType>(options_.push_type));
  if (compressed != nullptr) {
    header.set_dtype(static_cast<v1::DType>(compressed->compressor));
    header.set_topk_pairs(compressed->pairs);
  }
  const absl::Span<const float> part = gradient.subspan(r.begin, r.size());
  // Through shared memory if there is a segment, no other push of this client uses it and the
  // payload fits (a compressed one may not): it goes into its push region before the call starts.
  const std::shared_ptr<SharedPath>& shared = session.shared;
  std::unique_lock<std::mutex> turn;
  if (shared != nullptr &&
      (compressed == nullptr ||
       static_cast<int64_t>(compressed->bytes.size()) <= shared->segment.push().capacity())) {
    turn = std::unique_lock<std::mutex>(shared->push_mu, std::try_to_lock);
  }
  // Else over the data plane, if there is a connection (below: the gradient goes from `part`).
  // A compressed one, a fraction of the bytes, goes over gRPC.
  const std::shared_ptr<DataConnection> data =
      turn.owns_lock() || compressed != nullptr ? nullptr : DataOf(session, shard);
  // A tensor in one part goes as a call on the connection itself, with no gRPC call's round trips
  // (as long as its bytes' time at a few MiB). A held push's part whose values are still coming
  // goes so as they come, the last piece first, where the shard takes that; every other way
  // waits for them first.
  const bool call = data != nullptr && data->calls() &&
                    StripeCount(part.size(), options_.push_type, data->lanes()) == 1;
  const bool last_piece_first = fill != nullptr && call && data->last_piece_first() &&
                                options_.push_type == WireType::kFloat32;
  if (fill != nullptr && !last_piece_first) {
    if (grpc::Status s = AwaitFinal(*fill, shard, *context); !s.ok()) return s;
  }
  if (turn.owns_lock()) {
    SharedRegion region = shared->segment.push();
    const uint64_t ticket = shared->next_ticket++;
    if (!region.Claim(SharedRegion::kBusy, ticket, ClaimDeadline(*context))) {
      DropShared(shard, shared, "its push region stayed busy");
      return SharedMemoryLostStatus("shared push region busy");
    }
    if (compressed != nullptr) {
      std::memcpy(region.data(), compressed->bytes.data(), compressed->bytes.size());
    } else {
      *saturated = EncodeValues(part, options_.push_type, region.data());
    }
    region.Move(SharedRegion::kBusy, SharedRegion::kReady, ticket);
    header.set_shm_segment(shared->id);
    header.set_shm_ticket(ticket);
  }
  uint64_t transfer = 0;
  if (data != nullptr) {
    transfer = data->NextTransfer();
    header.set_data_connection(data->id());
    header.set_data_transfer(transfer);
  }
  if (call) {
    header.set_last_piece_first(last_piece_first);
    // A part sent as backward makes it takes what backward takes (up to kMaxStreamedValues, each
    // piece within the connection's stall of the last); its answer, an attempt's time after its
    // last piece went.
    const absl::Time attempt_end = absl::FromChrono(context->deadline());
    absl::StatusOr<DataConnection::Answered> made =
        last_piece_first ? data->PushCall(transfer, header.SerializeAsString(), part,
                                          options_.push_type, absl::Now() + kMaxStreamedValues,
                                          FrameKind::kPushCall, &fill->progress(shard),
                                          ValuesOrder::kLastPieceFirst, attempt_end - absl::Now())
                         : data->PushCall(transfer, header.SerializeAsString(), part,
                                          options_.push_type, attempt_end);
    if (!made.ok() && last_piece_first && fill->Dropped(shard)) {
      // This client cut its own frame (the push was dropped midway): the connection is gone, but
      // nothing is wrong with the plane, so another takes its place.
      RenewData(shard, data);
      return DroppedHereStatus();
    }
    if (!made.ok()) return PlaneCallFailed(shard, data, made.status());
    if (made->status.ok() && !response->ParseFromString(made->response)) {
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          "the shard's answer to a push on the data plane does not parse");
    }
    if (made->status.ok()) *saturated = made->saturated;
    if (IsDataPlaneLost(made->status)) DropData(shard, data, made->status.error_message());
    return made->status;
  }
  const Replica& replica = CurrentReplicaOf(shard);
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
          replica.channel.get(), *replica.push, context, response));
  if (turn.owns_lock() || transfer != 0) {
    grpc::Slice slice(first.SerializeAsString());
    writer->Write(grpc::ByteBuffer(&slice, 1));
  } else if (compressed != nullptr) {
    WriteCompressedChunks(writer.get(), first, compressed);
  } else {
    *saturated = WriteTensorChunks(writer.get(), first, part, options_.push_type);
  }
  absl::Status sent;
  if (transfer != 0) {
    writer->WaitForInitialMetadata();  // also when the call ended: then without the key
    if (context->GetServerInitialMetadata().count(kDataPlaneReady) > 0) {
      absl::StatusOr<int64_t> pushed =
          data->Push(transfer, part, options_.push_type, absl::FromChrono(context->deadline()));
      if (pushed.ok()) *saturated = *pushed;
      sent = pushed.status();
      if (!sent.ok()) context->TryCancel();
    }
  }
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (!sent.ok()) {
    DropData(shard, data, sent.message());
    return DataPlaneLostStatus(std::string(sent.message()));
  }
  if (IsSharedMemoryLost(status)) DropShared(shard, shared, status.error_message());
  if (IsDataPlaneLost(status)) DropData(shard, data, status.error_message());
  return status;
}

ShardedClient::Pending<ShardedClient::PushSummary> ShardedClient::StartPush(
    absl::Span<const float> gradient, int64_t sequence, Parts parts) {
  return BeginPush(gradient, sequence, parts == Parts::kHeld ? Launch::kHeld : Launch::kNow);
}

absl::StatusOr<ShardedClient::PushSummary> ShardedClient::Push(absl::Span<const float> gradient,
                                                               int64_t sequence) {
  return BeginPush(gradient, sequence, Launch::kLastHere).Wait();
}

ShardedClient::Pending<ShardedClient::PushSummary> ShardedClient::BeginPush(
    absl::Span<const float> gradient, int64_t sequence, Launch launch) {
  Impl* impl = impl_.get();
  std::shared_ptr<Impl::Steps> steps = impl->steps_;
  struct Answers {
    std::vector<v1::PushResponse> responses;
    std::vector<int64_t> saturated;
    Versions base;
    std::vector<std::shared_ptr<const CompressedTensor>> compressed;  // by shard, once sent
  };
  auto answers = std::make_shared<Answers>(
      Answers{std::vector<v1::PushResponse>(num_shards()),
              std::vector<int64_t>(num_shards(), 0),
              {},
              std::vector<std::shared_ptr<const CompressedTensor>>(num_shards())});
  {
    absl::MutexLock lock(&steps->mu);
    if (sequence == kNextSequence) sequence = steps->next;
    steps->next = std::max(steps->next, sequence + 1);
    steps->last_started = sequence;
    steps->pushing.insert(sequence);
    steps->pushed_since_pull = true;
    answers->base = steps->last_pull;
  }
  // A held push may be told how far its gradient is final (Pending::Filled); CancelPending stops
  // the parts waiting for more of it.
  std::shared_ptr<PushFill> fill;
  if (launch == Launch::kHeld) {
    fill = std::make_shared<PushFill>(impl->ranges_,
                                      [impl](int shard) { return impl->StreamsPush(shard); });
    absl::MutexLock lock(&impl->mu_);
    impl->fills_.erase(std::remove_if(impl->fills_.begin(), impl->fills_.end(),
                                      [](const std::weak_ptr<PushFill>& f) { return f.expired(); }),
                       impl->fills_.end());
    impl->fills_.push_back(fill);
  }
  std::shared_ptr<Call> call = impl->Start(
      [impl, gradient, sequence, answers, fill](int shard, grpc::ClientContext* context) {
        if (fill != nullptr && fill->Dropped(shard)) return DroppedHereStatus();
        // Compressed once, at the part's first attempt (its range is final then, also when
        // held): a retry resends the same bytes, and the residual moves once.
        std::shared_ptr<const CompressedTensor>& compressed = answers->compressed[shard];
        if (impl->compressor_ != nullptr && compressed == nullptr) {
          if (fill != nullptr) {
            if (grpc::Status s = Impl::AwaitFinal(*fill, shard, *context); !s.ok()) return s;
          }
          const Range& r = impl->ranges_[shard];
          absl::StatusOr<std::shared_ptr<const CompressedTensor>> c =
              impl->compressor_->Compress(shard, gradient.subspan(r.begin, r.size()));
          if (!c.ok()) return ToGrpcStatus(c.status());
          compressed = *std::move(c);
        }
        return impl->PushTo(shard, context, gradient, compressed, sequence, answers->base,
                            &answers->responses[shard], &answers->saturated[shard], fill.get());
      },
      /*retry=*/true, impl->options_.rpc_timeout,
      [steps, sequence] {
        absl::MutexLock lock(&steps->mu);
        steps->pushing.erase(steps->pushing.find(sequence));
      },
      launch, nullptr,
      // A part sent as backward makes it was busy until backward finished: its retries count
      // from there, as a part sent once final does.
      fill == nullptr ? nullptr : std::function<absl::Time(int)>([fill](int shard) {
        return fill->FinalAt(shard);
      }));
  return Pending<PushSummary>(
      std::move(call),
      [answers, sequence] {
        PushSummary summary;
        summary.sequence = sequence;
        for (int64_t n : answers->saturated) summary.saturated += n;
        for (const v1::PushResponse& r : answers->responses) {
          summary.max_staleness = std::max(summary.max_staleness, r.staleness());
          summary.duplicates += r.duplicate();
          summary.dropped += r.dropped();
        }
        return summary;
      },
      fill);
}

absl::StatusOr<std::vector<v1::StatsResponse>> ShardedClient::Impl::Stats() {
  std::vector<v1::StatsResponse> stats(num_shards());
  std::vector<int> last(num_shards(), -1);  // by shard: the highest worker id taken so far
  // One request serves every shard; shards know different workers, so a page goes on from the
  // lowest id where some shard's page ended, and each shard's workers already taken are skipped.
  for (int first = 0; first >= 0;) {
    v1::StatsRequest request;
    request.set_first_worker(first);
    absl::StatusOr<std::vector<v1::StatsResponse>> pages =
        CallEachShard(&v1::ParameterServer::Stub::GetStats, request);
    if (!pages.ok()) return pages.status();
    int next = -1;
    for (int shard = 0; shard < num_shards(); ++shard) {
      v1::StatsResponse& page = (*pages)[shard];
      if (first == 0) {
        stats[shard] = page;
        stats[shard].clear_workers();
      }
      for (const v1::WorkerStats& w : page.workers()) {
        if (w.worker_id() <= last[shard]) continue;
        *stats[shard].add_workers() = w;
        last[shard] = w.worker_id();
      }
      if (page.next_worker() > first && (next < 0 || page.next_worker() < next)) {
        next = page.next_worker();
      }
    }
    first = next;
  }
  for (v1::StatsResponse& s : stats) s.set_next_worker(-1);
  return stats;
}

absl::StatusOr<int64_t> ShardedClient::Register() { return impl_->Register(); }

absl::StatusOr<int> ShardedClient::Initialize(absl::Span<const float> params) {
  return impl_->Initialize(params);
}

absl::StatusOr<std::vector<v1::StatsResponse>> ShardedClient::Stats() { return impl_->Stats(); }

absl::StatusOr<std::vector<v1::CheckpointResponse>> ShardedClient::Checkpoint() {
  return impl_->CallEachShard(&v1::ParameterServer::Stub::Checkpoint, v1::CheckpointRequest());
}

int64_t ShardedClient::incarnation(int shard) const { return impl_->SessionOf(shard).incarnation; }

int ShardedClient::reregistrations() const {
  absl::MutexLock lock(&impl_->sessions_mu_);
  return impl_->reregistrations_;
}

absl::Status ShardedClient::Heartbeat(absl::Duration timeout) {
  return impl_->TellEachShard(timeout, &v1::ParameterServer::Stub::Heartbeat);
}

absl::Status ShardedClient::Leave(absl::Duration timeout) {
  return impl_->TellEachShard(timeout, &v1::ParameterServer::Stub::Leave);
}

void ShardedClient::LimitCallsTo(absl::Duration timeout) {
  impl_->options_.rpc_timeout = timeout;
  impl_->options_.retry_for = absl::ZeroDuration();
}

void ShardedClient::CancelPending() {
  std::vector<std::weak_ptr<Call>> holding;
  std::vector<std::weak_ptr<PushFill>> fills;
  {
    absl::MutexLock lock(&impl_->mu_);
    ++impl_->generation_;
    for (grpc::ClientContext* c : impl_->in_flight_) c->TryCancel();
    holding.swap(impl_->holding_);
    fills.swap(impl_->fills_);
  }
  {
    // Calls made on a data-plane connection wait on it, not on a context: it ends, and they fail
    // at once (later calls go over gRPC).
    absl::MutexLock lock(&impl_->sessions_mu_);
    for (const Impl::Session& s : impl_->sessions_) {
      if (s.data != nullptr) s.data->End();
    }
  }
  for (const std::weak_ptr<Call>& c : holding) {
    if (std::shared_ptr<Call> call = c.lock()) {
      call->Abandon(absl::CancelledError("cancelled before this shard's part was sent"));
    }
  }
  for (const std::weak_ptr<PushFill>& f : fills) {  // parts waiting for more of their values
    if (std::shared_ptr<PushFill> fill = f.lock()) fill->Stop();
  }
}

void ShardedClient::Close() {
  {
    absl::MutexLock lock(&impl_->mu_);
    impl_->closed_ = true;
  }
  CancelPending();
}

}  // namespace ps
