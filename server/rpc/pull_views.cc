#include "server/rpc/pull_views.h"

#include <algorithm>
#include <string>

#include "transport/data_frames.h"

namespace ps {

PullViews::PullViews(int64_t size, int max_views) : size_(size), max_views_(max_views) {}

int PullViews::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(views_.size());
}

void PullViews::Forget(int worker) {
  absl::MutexLock lock(&mu_);
  views_.erase(worker);
}

PullViews::Answer PullViews::Encode(int worker, uint64_t held, absl::Span<const float> values,
                                    WireType type, const Compression& compression) {
  if (max_views_ == 0) return Answer{};
  std::shared_ptr<View> view;
  {
    absl::MutexLock lock(&mu_);
    auto it = views_.find(worker);
    if (it == views_.end()) {
      if (static_cast<int>(views_.size()) >= max_views_) {
        views_.erase(std::min_element(
            views_.begin(), views_.end(),
            [](const auto& a, const auto& b) { return a.second.used < b.second.used; }));
      }
      it = views_.emplace(worker, Kept{std::make_shared<View>()}).first;
    }
    it->second.used = ++clock_;
    view = it->second.view;
  }
  absl::MutexLock lock(&view->mu);
  Answer answer;
  uint64_t next = RandomId();
  while (next == 0 || next == view->id) next = RandomId();
  if (held != 0 && held == view->id) {
    BufferPool::Lease buffer = changes_.Acquire(size_);
    const absl::Span<float> change = buffer.span();
    for (int64_t i = 0; i < size_; ++i) change[i] = values[i] - view->values[i];
    Compress(compression, change, &answer.change);
    // The worker adds what it decodes from these bytes; so does its view here, bit for bit.
    CompressedDecoder decoder(compression.compressor, answer.change.pairs, change);
    decoder.Append(answer.change.bytes).IgnoreError();  // encoded just now: well formed
    for (int64_t i = 0; i < size_; ++i) view->values[i] += change[i];
    answer.base = held;
  } else {
    std::string wire;
    EncodeValues(values, type, &wire);
    view->values.resize(size_);
    DecodeValues(wire, type, absl::MakeSpan(view->values));
  }
  view->id = next;
  answer.view = next;
  return answer;
}

}  // namespace ps
