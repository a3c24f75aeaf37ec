// Server-side limits on calls that gRPC itself does not impose, so that no client can hold a
// shard's memory, threads or initialisation slot without end:
//   CallLimit      at most N calls of a kind in progress (and M per worker identity); the next is
//                  refused at once.
//   StreamWatchdog cancels a streaming call that moves no message for `idle`, or that runs
//                  longer than `total` (gRPC has no server-side deadline of its own).
// Both are thread-safe.
#pragma once

#include <grpcpp/server_context.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "transport/security.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ps {

class CallLimit {
 public:
  // At most `max_calls` in progress, and at most `max_per_worker` of them (0: no such cap) by any
  // one worker's own token (per-worker identity), and as many by all callers that act as no
  // worker (Caller::kNoWorker: observers, the operator); `what` names the calls in refusals.
  CallLimit(std::string what, int max_calls, int max_per_worker = 0)
      : what_(std::move(what)), max_calls_(max_calls), max_per_worker_(max_per_worker) {}

  // Holds one of the places while it lives.
  class Slot {
   public:
    Slot(Slot&& o) noexcept : limit_(o.limit_), worker_(o.worker_) { o.limit_ = nullptr; }
    Slot& operator=(Slot&& o) noexcept;
    ~Slot();

   private:
    friend class CallLimit;
    Slot(CallLimit* limit, int worker) : limit_(limit), worker_(worker) {}
    CallLimit* limit_;
    int worker_;
  };
  // A place for a call by `worker` (Caller::worker: >= 0, a worker's own token, and kNoWorker
  // count against their cap; kAnyWorker, as without per-worker identity, only against the
  // total); RESOURCE_EXHAUSTED saying which limit is reached if none is free.
  absl::StatusOr<Slot> TryAcquire(int worker = Caller::kAnyWorker);
  int max_calls() const { return max_calls_; }
  const std::string& what() const { return what_; }
  int in_use() const;
  // TryAcquire's refusals so far.
  int64_t refused() const;

 private:
  const std::string what_;
  const int max_calls_, max_per_worker_;
  mutable absl::Mutex mu_;
  int in_use_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, int> by_worker_ ABSL_GUARDED_BY(mu_);  // workers holding a place: how many
};

class StreamWatchdog {
 public:
  StreamWatchdog(absl::Duration idle, absl::Duration total);
  // Stops the watching thread. REQUIRES: no Guard is alive.
  ~StreamWatchdog();

  // Watches one call from its creation to its destruction; after that the watchdog never touches
  // the context again.
  class Guard {
   public:
    Guard(Guard&& o) noexcept : dog_(o.dog_), id_(o.id_) { o.dog_ = nullptr; }
    Guard& operator=(Guard&&) = delete;
    ~Guard();
    // A message moved: the idle clock starts again.
    void Progress();

   private:
    friend class StreamWatchdog;
    Guard(StreamWatchdog* dog, int64_t id) : dog_(dog), id_(id) {}
    StreamWatchdog* dog_;
    int64_t id_;
  };
  Guard Watch(grpc::ServerContextBase* context);

 private:
  struct Entry {
    grpc::ServerContextBase* context;
    absl::Time started, last_progress;
    bool cancelled = false;
  };
  void Loop();

  const absl::Duration idle_, total_;
  absl::Mutex mu_;
  std::map<int64_t, Entry> calls_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ps
