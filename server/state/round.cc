#include "server/state/round.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"

namespace ps {
namespace {

using Parts = absl::Span<const absl::Span<const float>>;

// Whether adding `parts` to `sum`, in their order for each element, keeps every value finite.
bool StaysFinite(absl::Span<const float> sum, Parts parts) {
  bool finite = true;
  for (size_t i = 0; i < sum.size(); ++i) {
    float s = sum[i];
    for (absl::Span<const float> part : parts) s += part[i];
    finite &= std::isfinite(s);
  }
  return finite;
}

// Adds `parts` to `sum`, one after another: each element gets them in their order, as in
// StaysFinite.
void AddParts(absl::Span<float> sum, Parts parts) {
  for (absl::Span<const float> part : parts) {
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
  }
}

}  // namespace

Round::Round(int64_t size, int num_workers)
    : size_(size), num_workers_(num_workers), buffers_(std::max(0, num_workers - 1)) {}

bool Round::InTurn(int id, Expected expected) const {
  for (int lower = 0; lower < id; ++lower) {
    if (held_.count(lower) > 0) return false;
    if (contributors_.count(lower) == 0 && expected(lower)) return false;
  }
  return true;
}

absl::Status Round::Add(int id, absl::Span<const float> values, Expected expected) {
  if (sum_.empty()) sum_.assign(size_, 0.0f);
  if (!InTurn(id, expected)) {
    BufferPool::Lease buffer = buffers_.Acquire(values.size());
    std::copy(values.begin(), values.end(), buffer.span().begin());
    held_.emplace(id, std::move(buffer));
    contributors_.insert(id);
    return absl::OkStatus();
  }
  // This push, then the held ones it lets through: the higher ranks up to the next one expected.
  absl::InlinedVector<absl::Span<const float>, 8> parts = {values};
  absl::InlinedVector<int, 8> through;
  for (int higher = id + 1; higher < num_workers_; ++higher) {
    auto held = held_.find(higher);
    if (held != held_.end()) {
      parts.push_back(held->second.span());
      through.push_back(higher);
    } else if (contributors_.count(higher) == 0 && expected(higher)) {
      break;
    }
  }
  if (!StaysFinite(sum_, parts)) {
    return absl::InvalidArgumentError(
        absl::StrCat("adding worker ", id, "'s gradient",
                     through.empty() ? "" : absl::StrCat(" (and the ", through.size(),
                                                         " of higher ranks held for it)"),
                     " would make the round's sum non-finite"));
  }
  AddParts(absl::MakeSpan(sum_), parts);
  for (int higher : through) held_.erase(higher);
  contributors_.insert(id);
  return absl::OkStatus();
}

absl::Span<float> Round::Fold() {
  if (sum_.empty()) sum_.assign(size_, 0.0f);
  for (const auto& [id, buffer] : held_) AddParts(absl::MakeSpan(sum_), {buffer.span()});
  held_.clear();
  return absl::MakeSpan(sum_);
}

void Round::Clear() {
  std::fill(sum_.begin(), sum_.end(), 0.0f);
  contributors_.clear();
  restored_.clear();
  held_.clear();
}

void Round::SaveSum(std::vector<float>* out) const {
  if (sum_.empty()) {
    out->assign(size_, 0.0f);
  } else {
    out->assign(sum_.begin(), sum_.end());
  }
  for (const auto& [id, buffer] : held_) AddParts(absl::MakeSpan(*out), {buffer.span()});
}

void Round::Restore(std::vector<float> sum, std::set<int> contributors) {
  held_.clear();
  sum_ = std::move(sum);
  restored_ = contributors;
  contributors_ = std::move(contributors);
}

}  // namespace ps
