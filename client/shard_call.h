// The client's fan-out machinery (client/sharded_client.h's internals): CallThreads, the threads
// that run the shards' parts of calls; ShardedClient::Call, one call to every shard; and
// ShardedClient::PushFill, how far a held push's gradient is final. Included by the client's own
// sources only.
#pragma once

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/sharded_client.h"
#include "common/fill_progress.h"

namespace ps {

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

}  // namespace ps
