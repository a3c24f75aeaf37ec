#include "server/state/apply_threads.h"

#include <algorithm>

#include "server/state/cpus.h"
#include "server/state/denormals.h"

namespace ps {

ApplyThreads::ApplyThreads(int threads) {
  threads = std::clamp(threads, 1, kMaxThreads);
  for (int part = 1; part < threads; ++part) threads_.emplace_back([this, part] { Loop(part); });
}

ApplyThreads::~ApplyThreads() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

int ApplyThreads::Auto() { return std::clamp(UsableCpus() / 2, 1, 8); }

int ApplyThreads::Parts(int64_t n) const {
  return static_cast<int>(std::clamp<int64_t>(n / kMinPart, 1, size()));
}

void ApplyThreads::RunPart(const Job& job, int part) {
  // Split on 16-element boundaries so that no two parts write the same cache line.
  const int64_t lines = (job.n + 15) / 16;
  const int64_t begin = std::min(job.n, lines * part / job.parts * 16);
  const int64_t end = std::min(job.n, lines * (part + 1) / job.parts * 16);
  if (begin < end) (*job.fn)(part, begin, end);
}

void ApplyThreads::Run(int64_t n, absl::FunctionRef<void(int, int64_t, int64_t)> fn) {
  const Job job{&fn, n, Parts(n)};
  if (job.parts == 1) {
    RunPart(job, 0);
    return;
  }
  absl::MutexLock turn(&run_mu_);
  {
    absl::MutexLock lock(&mu_);
    job_ = job;
    pending_ = job.parts - 1;
    ++generation_;
  }
  RunPart(job, 0);
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* pending) { return *pending == 0; }, &pending_));
}

void ApplyThreads::Loop(int part) {
  ScopedFlushDenormals flush;  // as the optimizer's calling thread does
  int64_t seen = 0;
  absl::MutexLock lock(&mu_);
  for (;;) {
    auto woken = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || generation_ != seen;
    };
    mu_.Await(absl::Condition(&woken));
    if (stopping_) return;
    seen = generation_;
    if (part >= job_.parts) continue;  // a small job: not this thread's
    Job job = job_;
    mu_.Unlock();
    RunPart(job, part);
    mu_.Lock();
    --pending_;
  }
}

}  // namespace ps
