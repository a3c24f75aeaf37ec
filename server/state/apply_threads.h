// A fixed set of threads that run one function over the parts of a range together (fork-join):
// the optimizer's passes over a shard use it to apply one push on several cores.
// Thread-safe: callers of Run from several threads take turns. Run returns only when every part
// is done, so what a part writes is visible to the caller afterwards.
#pragma once

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace ps {

class ApplyThreads {
 public:
  // Parts smaller than this are not worth waking a thread for (a few microseconds of work).
  static constexpr int64_t kMinPart = 64 * 1024;
  static constexpr int kMaxThreads = 64;

  // `threads` (1..kMaxThreads) is the number of parts run at once, the caller's own included:
  // 1 starts no thread.
  explicit ApplyThreads(int threads = 1);
  // The default thread count: half the CPUs this process may run on (its affinity mask), at
  // least 1 and at most 8. On the 16-core GPU machine 8 threads applied a 38 MiB push 2.7x
  // faster than 1 (apply_bench); beyond 8 a single shard's memory bandwidth gains little.
  static int Auto();
  ApplyThreads(const ApplyThreads&) = delete;
  ApplyThreads& operator=(const ApplyThreads&) = delete;
  ~ApplyThreads();

  int size() const { return static_cast<int>(threads_.size()) + 1; }
  // How many parts Run splits [0, n) into: size(), fewer when parts would be below kMinPart.
  int Parts(int64_t n) const;
  // Calls fn(part, begin, end) for each of Parts(n) contiguous parts of [0, n), part 0 on the
  // calling thread, the others on the pool's threads, and returns when all have returned. Part
  // boundaries are multiples of 16 elements (whole cache lines of float32).
  void Run(int64_t n, absl::FunctionRef<void(int part, int64_t begin, int64_t end)> fn);

 private:
  struct Job {
    absl::FunctionRef<void(int, int64_t, int64_t)>* fn = nullptr;
    int64_t n = 0;
    int parts = 0;
  };
  static void RunPart(const Job& job, int part);
  void Loop(int part);

  absl::Mutex run_mu_;  // one Run at a time
  absl::Mutex mu_;
  Job job_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // one more for every Run
  int pending_ ABSL_GUARDED_BY(mu_) = 0;         // parts of this generation still running
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace ps
