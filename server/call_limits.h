// Server-side limits on calls that gRPC itself does not impose, so that no client can hold a
// shard's memory, threads or initialisation slot without end:
//   CallLimit      at most N calls of a kind in progress; the next is refused at once.
//   StreamWatchdog cancels a streaming call that moves no message for `idle`, or that runs
//                  longer than `total` (gRPC has no server-side deadline of its own).
// Both are thread-safe.
#pragma once

#include <grpcpp/server_context.h>

#include <cstdint>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ps {

class CallLimit {
 public:
  explicit CallLimit(int max_calls) : max_calls_(max_calls) {}

  // Holds one of the N places while it lives; empty (false) if none was free.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& o) noexcept : limit_(o.limit_) { o.limit_ = nullptr; }
    Slot& operator=(Slot&& o) noexcept;
    ~Slot();
    explicit operator bool() const { return limit_ != nullptr; }

   private:
    friend class CallLimit;
    explicit Slot(CallLimit* limit) : limit_(limit) {}
    CallLimit* limit_ = nullptr;
  };
  Slot TryAcquire();
  int max_calls() const { return max_calls_; }
  int in_use() const;

 private:
  const int max_calls_;
  mutable absl::Mutex mu_;
  int in_use_ ABSL_GUARDED_BY(mu_) = 0;
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
