#include "server/state/shard_values.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

// values += change, all or nothing: INVALID_ARGUMENT, and nothing changed, if a sum would not be
// finite.
absl::Status AddInPlace(absl::Span<float> values, absl::Span<const float> change) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i] + change[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("adding the change would make value ", i, " of the shard non-finite"));
    }
  }
  for (size_t i = 0; i < values.size(); ++i) values[i] += change[i];
  return absl::OkStatus();
}

std::unique_ptr<Optimizer> FreshOptimizer(const OptimizerConfig& config, int64_t size) {
  absl::StatusOr<std::unique_ptr<Optimizer>> made = MakeOptimizer(config, size);
  return made.ok() ? *std::move(made) : nullptr;  // ParameterShard::Create validated the config
}

}  // namespace

ShardValues::ShardValues(Range range, int64_t trained, OptimizerConfig optimizer, bool add_changes,
                         int apply_threads)
    : range_(range),
      trained_(trained),
      optimizer_config_(std::move(optimizer)),
      add_changes_(add_changes),
      apply_threads_(apply_threads) {}

void ShardValues::Reset(absl::Span<const float> values, int64_t version) {
  std::unique_ptr<Optimizer> optimizer = FreshOptimizer(optimizer_config_, trained_);
  absl::MutexLock lock(&mu_);
  weights_.assign(values.begin(), values.end());
  optimizer_ = std::move(optimizer);
  version_ = version;
}

absl::Status ShardValues::Update(absl::Span<const float> gradient, float lr, int64_t version,
                                 float max_abs) {
  absl::MutexLock lock(&mu_);
  if (add_changes_) {
    if (absl::Status s = AddInPlace(absl::MakeSpan(weights_), gradient); !s.ok()) return s;
  } else {
    if (trained_ > 0) {  // (a range of buffers only has nothing to train)
      absl::Status s =
          optimizer_->Apply(absl::MakeSpan(weights_).first(trained_), gradient.first(trained_), lr,
                            version, &apply_threads_, max_abs);
      if (!s.ok()) return s;
    }
    // The buffers take the pushed values (finite: the push or the round's sum was checked).
    std::copy(gradient.begin() + trained_, gradient.end(), weights_.begin() + trained_);
  }
  version_ = version + 1;
  return absl::OkStatus();
}

absl::Status ShardValues::Import(const ShardState& state, int64_t version) {
  const std::vector<float>* values = state.Find(kValuesTensor);
  if (values == nullptr || static_cast<int64_t>(values->size()) != range_.size()) {
    return absl::InvalidArgumentError("the state holds no values of the shard's size");
  }
  std::unique_ptr<Optimizer> optimizer = FreshOptimizer(optimizer_config_, trained_);
  for (auto& [slot, into] : optimizer->MutableState()) {
    const std::vector<float>* saved = state.Find(kOptimizerTensorPrefix + slot);
    if (saved == nullptr || saved->size() != into.size()) {
      return absl::InvalidArgumentError("the state has no optimizer slot " + slot +
                                        " of the shard's size");
    }
    std::copy(saved->begin(), saved->end(), into.begin());
  }
  absl::MutexLock lock(&mu_);
  weights_ = *values;
  optimizer_ = std::move(optimizer);
  version_ = version;
  return absl::OkStatus();
}

void ShardValues::Export(ShardState* out) const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<float>& values = out->AddTensor(kValuesTensor);
  values = weights_;  // copy-assignment keeps the destination's storage when it fits
  for (const auto& [slot, state] : optimizer_->State()) {
    out->AddTensor(kOptimizerTensorPrefix + slot).assign(state.begin(), state.end());
  }
}

void ShardValues::Read(absl::FunctionRef<void(absl::Span<const float>)> fn) const {
  absl::ReaderMutexLock lock(&mu_);
  fn(weights_);
}

ShardValues::Snapshot ShardValues::Copy(int64_t offset, int64_t length, const CopyOut& copy_out,
                                        bool keep_copy, const Filling& filling) {
  const bool direct = copy_out != nullptr && !keep_copy;
  Snapshot snapshot{0, offset, direct ? BufferPool::Lease() : snapshot_buffers_.Acquire(length)};
  {
    absl::ReaderMutexLock lock(&mu_);
    snapshot.version = version_;
    absl::Span<const float> values(weights_.data() + (offset - range_.begin), length);
    if (direct) {
      copy_out(values);
    } else if (FillProgress* progress = filling != nullptr && copy_out == nullptr
                                            ? filling(snapshot.values.span())
                                            : nullptr) {
      for (int64_t i = 0; i < length; i += kFillPiece) {
        const int64_t n = std::min(kFillPiece, length - i);
        std::copy_n(values.begin() + i, n, snapshot.values.span().begin() + i);
        progress->Add(n);
      }
    } else {
      std::copy_n(values.begin(), length, snapshot.values.span().begin());
    }
  }
  if (copy_out != nullptr && !direct) copy_out(snapshot.values.span());
  return snapshot;
}

}  // namespace ps
