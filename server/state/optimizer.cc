#include "server/state/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/state/denormals.h"

namespace ps {
namespace {

// An update is proven finite when every value it computes stays below this (the float results
// are within a few roundings of the real-number bounds computed in double).
constexpr double kProvenFinite = std::numeric_limits<float>::max() / 4.0;

// Elements per block of a commit: the update runs over a block, then the maxima are taken over
// it while it is still in the cache.
constexpr size_t kBlock = 2048;

// max |p[i]| over [0, n), or infinity if any value is not finite. Written with GCC's vector
// extensions: neither GCC 12 nor clang vectorises a running max of floats by itself. Built for
// AVX2 too, chosen at run time where the processor has it.
__attribute__((target_clones("avx2", "default"))) float MaxAbs(const float* p, size_t n) {
  using F4 = float __attribute__((vector_size(16)));
  using I4 = int32_t __attribute__((vector_size(16)));
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr float kMax = std::numeric_limits<float>::max();
  const I4 abs_mask = {0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff};
  const F4 max_finite = {kMax, kMax, kMax, kMax};
  const F4 inf = {kInf, kInf, kInf, kInf};
  F4 lane[4] = {};
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int k = 0; k < 4; ++k) {
      F4 x;
      std::memcpy(&x, p + i + 4 * k, sizeof(x));
      F4 a = reinterpret_cast<F4>(reinterpret_cast<I4>(x) & abs_mask);
      a = a <= max_finite ? a : inf;  // NaN fails the comparison too
      lane[k] = a > lane[k] ? a : lane[k];
    }
  }
  float m = 0;
  for (const F4& l : lane) {
    for (int k = 0; k < 4; ++k) m = std::max(m, l[k]);
  }
  for (; i < n; ++i) m = std::isfinite(p[i]) ? std::max(m, std::fabs(p[i])) : kInf;
  return m;
}

// Each algorithm is written once: Prepare(lr, step) computes what is constant for one update,
// Update<kCommit>(i, w, g, offset, params) computes element i's new weight and state, returns
// whether they are finite, and writes them (w and the state) only when kCommit, and Bound bounds an
// update's values (Optimizer::Bound).
// Kernel<> runs Update as the dry-run check and as the commit.
template <typename Algorithm>
class Kernel : public Optimizer {
 protected:
  using Optimizer::Optimizer;
  int64_t FirstNonFinite(absl::Span<const float> w, absl::Span<const float> g, int64_t offset,
                         float lr, int64_t step) override {
    auto& self = static_cast<Algorithm&>(*this);
    const auto params = self.Prepare(lr, step);
    const float* __restrict wp = w.data();
    const float* __restrict gp = g.data();
    bool finite = true;
    for (size_t i = 0; i < w.size(); ++i) {
      float copy = wp[i];
      finite &= self.template Update<false>(i, copy, gp[i], offset, params);
    }
    if (finite) return -1;
    for (size_t i = 0; i < w.size(); ++i) {  // rare: find which element
      float copy = w[i];
      if (!self.template Update<false>(i, copy, g[i], offset, params)) {
        return static_cast<int64_t>(i);
      }
    }
    return -1;
  }
  Magnitudes Commit(absl::Span<float> w, absl::Span<const float> g, int64_t offset, float lr,
                    int64_t step) override {
    auto& self = static_cast<Algorithm&>(*this);
    const auto params = self.Prepare(lr, step);
    std::vector<std::pair<std::string, absl::Span<float>>> slots = Slots();
    Magnitudes m{0, {0, 0}};
    float* __restrict wp = w.data();
    const float* __restrict gp = g.data();
    for (size_t b = 0; b < w.size(); b += kBlock) {
      const size_t e = std::min(w.size(), b + kBlock);
      // Elements are independent: the weights and the state never overlap.
#pragma GCC ivdep
      for (size_t i = b; i < e; ++i) self.template Update<true>(i, wp[i], gp[i], offset, params);
      m.weights = std::max<double>(m.weights, MaxAbs(w.data() + b, e - b));
      for (size_t k = 0; k < slots.size(); ++k) {
        m.state[k] =
            std::max<double>(m.state[k], MaxAbs(slots[k].second.data() + offset + b, e - b));
      }
    }
    return m;
  }
};

// w -= lr * g
class Sgd : public Kernel<Sgd> {
 public:
  explicit Sgd(int64_t size) : Kernel(size) {}
  std::string Name() const override { return "sgd"; }
  std::vector<std::pair<std::string, absl::Span<float>>> Slots() override { return {}; }
  float Prepare(float lr, int64_t) const { return lr; }
  template <bool kCommit>
  bool Update(size_t, float& w, float g, int64_t, float lr) {
    float nw = w - lr * g;
    if (kCommit) w = nw;
    return std::isfinite(nw);
  }
  double Bound(float lr, int64_t, double g, const Magnitudes& m) const override {
    return m.weights + std::fabs(lr) * g;
  }
};

// Heavy ball: v = mu * v + g; w -= lr * v. Nesterov: w -= lr * (g + mu * v) (PyTorch's form).
class Momentum : public Kernel<Momentum> {
 public:
  Momentum(int64_t size, float mu, bool nesterov)
      : Kernel(size), v_(size, 0.0f), mu_(mu), nesterov_(nesterov) {}
  std::string Name() const override { return nesterov_ ? "nesterov" : "momentum"; }
  std::vector<std::pair<std::string, absl::Span<float>>> Slots() override {
    return {{"momentum", absl::MakeSpan(v_)}};
  }
  float Prepare(float lr, int64_t) const { return lr; }
  template <bool kCommit>
  bool Update(size_t i, float& w, float g, int64_t offset, float lr) {
    float& v = v_[offset + i];
    float nv = mu_ * v + g;
    float nw = w - lr * (nesterov_ ? g + mu_ * nv : nv);
    if (kCommit) {
      v = nv;
      w = nw;
    }
    return std::isfinite(nv) && std::isfinite(nw);
  }
  double Bound(float lr, int64_t, double g, const Magnitudes& m) const override {
    double v = mu_ * m.state[0] + g;
    return std::max(v, m.weights + std::fabs(lr) * (nesterov_ ? g + mu_ * v : v));
  }

 private:
  std::vector<float> v_;
  float mu_;
  bool nesterov_;
};

// Adam (Kingma & Ba) with bias correction by the shard's update count.
class Adam : public Kernel<Adam> {
 public:
  Adam(int64_t size, const OptimizerConfig& c)
      : Kernel(size), m_(size, 0.0f), v_(size, 0.0f), c_(c) {}
  std::string Name() const override { return "adam"; }
  std::vector<std::pair<std::string, absl::Span<float>>> Slots() override {
    return {{"adam_m", absl::MakeSpan(m_)}, {"adam_v", absl::MakeSpan(v_)}};
  }
  struct Params {
    float lr, correction1, correction2;
  };
  Params Prepare(float lr, int64_t step) const {
    double t = static_cast<double>(step + 1);
    return {lr, static_cast<float>(1.0 - std::pow(c_.beta1, t)),
            static_cast<float>(1.0 - std::pow(c_.beta2, t))};
  }
  template <bool kCommit>
  bool Update(size_t i, float& w, float g, int64_t offset, const Params& p) {
    float& m = m_[offset + i];
    float& v = v_[offset + i];
    float nm = c_.beta1 * m + (1 - c_.beta1) * g;
    float nv = c_.beta2 * v + (1 - c_.beta2) * g * g;
    float nw = w - p.lr * (nm / p.correction1) / (std::sqrt(nv / p.correction2) + c_.epsilon);
    if (kCommit) {
      m = nm;
      v = nv;
      w = nw;
    }
    return std::isfinite(nm) && std::isfinite(nv) && std::isfinite(nw);
  }
  double Bound(float lr, int64_t step, double g, const Magnitudes& before) const override {
    const Params p = Prepare(lr, step);
    double m = c_.beta1 * before.state[0] + (1 - c_.beta1) * g;
    double v = c_.beta2 * before.state[1] + (1 - c_.beta2) * g * g;
    // lr * (m / c1) is computed before the division by sqrt(v / c2) + eps >= eps.
    double scaled = std::fabs(p.lr) * (m / p.correction1);
    double step_size = scaled / c_.epsilon;
    return std::max({g * g, m / p.correction1, v / p.correction2, scaled, step_size,
                     before.weights + step_size});
  }

 private:
  std::vector<float> m_, v_;
  OptimizerConfig c_;
};

// AdaGrad: s += g^2; w -= lr * g / (sqrt(s) + eps).
class AdaGrad : public Kernel<AdaGrad> {
 public:
  AdaGrad(int64_t size, float eps) : Kernel(size), s_(size, 0.0f), eps_(eps) {}
  std::string Name() const override { return "adagrad"; }
  std::vector<std::pair<std::string, absl::Span<float>>> Slots() override {
    return {{"adagrad_sum", absl::MakeSpan(s_)}};
  }
  float Prepare(float lr, int64_t) const { return lr; }
  template <bool kCommit>
  bool Update(size_t i, float& w, float g, int64_t offset, float lr) {
    float& s = s_[offset + i];
    float ns = s + g * g;
    float nw = w - lr * g / (std::sqrt(ns) + eps_);
    if (kCommit) {
      s = ns;
      w = nw;
    }
    return std::isfinite(ns) && std::isfinite(nw);
  }
  double Bound(float lr, int64_t, double g, const Magnitudes& m) const override {
    // lr * g is computed before the division by sqrt(s) + eps >= eps.
    double scaled = std::fabs(lr) * g;
    double step_size = scaled / eps_;
    return std::max({m.state[0] + g * g, scaled, step_size, m.weights + step_size});
  }

 private:
  std::vector<float> s_;
  float eps_;
};

}  // namespace

// lane[k] += p[i]^2 (in double) for i = k mod 16, over whole groups of 16 in order. Built for
// AVX2 too, chosen at run time (as MaxAbs): 1.6-1.9x the scan's rate on a cached run here; no FMA
// (not part of "avx2"), so both versions give the same bits.
__attribute__((target_clones("avx2", "default"))) static void AddSquares(const float* p, int64_t n,
                                                                         double* lane_out) {
  double lane[16];
  std::copy(lane_out, lane_out + 16, lane);
  for (int64_t i = 0; i + 16 <= n; i += 16) {
    for (int k = 0; k < 16; ++k) lane[k] += static_cast<double>(p[i + k]) * p[i + k];
  }
  std::copy(lane, lane + 16, lane_out);
}

GradientScan::GradientScan(absl::Span<const float> g, bool squares)
    : g_(g), squares_(squares), blocks_((static_cast<int64_t>(g.size()) + kBlock - 1) / kBlock) {}

void GradientScan::Add(absl::Span<const float> run) {
  ScopedFlushDenormals flush;  // as ScanGradient, wherever it runs
  int64_t at = run.data() - g_.data();
  const int64_t end = at + static_cast<int64_t>(run.size());
  while (at < end) {
    const int64_t n = std::min(end, (at / kBlock + 1) * kBlock) - at;
    AddToBlock(blocks_[at / kBlock], g_.data() + at, n);
    at += n;
  }
}

void GradientScan::AddToBlock(Block& b, const float* p, int64_t n) const {
  b.count += n;
  b.max_abs = std::max(b.max_abs, MaxAbs(p, n));
  if (!squares_) return;
  if (b.carried > 0) {  // complete the group the last run left open
    const int64_t take = std::min<int64_t>(n, kLanes - b.carried);
    std::copy(p, p + take, b.carry + b.carried);
    b.carried += static_cast<int>(take);
    p += take;
    n -= take;
    if (b.carried < kLanes) return;
    AddSquares(b.carry, kLanes, b.lane);
    b.carried = 0;
  }
  const int64_t whole = n / kLanes * kLanes;
  AddSquares(p, whole, b.lane);
  std::copy(p + whole, p + n, b.carry);
  b.carried = static_cast<int>(n - whole);
}

int64_t GradientScan::count() const {
  int64_t n = 0;
  for (const Block& b : blocks_) n += b.count;
  return n;
}

GradientSummary GradientScan::Finish() const {
  GradientSummary summary;
  for (const Block& b : blocks_) {
    summary.max_abs = std::max(summary.max_abs, b.max_abs);
    double sum = 0;
    for (int k = 0; k < b.carried; ++k) sum += static_cast<double>(b.carry[k]) * b.carry[k];
    for (double s : b.lane) sum += s;
    summary.sum_of_squares += sum;
  }
  if (!std::isfinite(summary.max_abs)) {  // rare (a rejected push): find where
    for (size_t i = 0; i < g_.size(); ++i) {
      if (!std::isfinite(g_[i])) {
        summary.first_nonfinite = static_cast<int64_t>(i);
        break;
      }
    }
  }
  return summary;
}

GradientSummary ScanGradient(absl::Span<const float> g, ApplyThreads* threads, bool squares) {
  ScopedFlushDenormals flush;  // here and in Apply (see server/state/denormals.h)
  const int parts = threads != nullptr ? threads->Parts(g.size()) : 1;
  std::vector<GradientSummary> found(parts);
  auto scan = [&](int part, int64_t begin, int64_t end) {
    const absl::Span<const float> values = g.subspan(begin, end - begin);
    GradientScan s(values, squares);
    s.Add(values);
    found[part] = s.Finish();
    if (found[part].first_nonfinite >= 0) found[part].first_nonfinite += begin;
  };
  if (threads != nullptr) {
    threads->Run(g.size(), scan);
  } else {
    scan(0, 0, g.size());
  }
  GradientSummary summary;
  for (int part = 0; part < parts; ++part) {
    summary.max_abs = std::max(summary.max_abs, found[part].max_abs);
    summary.sum_of_squares += found[part].sum_of_squares;
    if (summary.first_nonfinite < 0) summary.first_nonfinite = found[part].first_nonfinite;
  }
  return summary;
}

std::vector<std::pair<std::string, absl::Span<const float>>> Optimizer::State() const {
  std::vector<std::pair<std::string, absl::Span<const float>>> views;
  for (auto& [name, slot] : const_cast<Optimizer*>(this)->Slots()) views.emplace_back(name, slot);
  return views;
}

std::vector<std::pair<std::string, absl::Span<float>>> Optimizer::MutableState() {
  magnitudes_ = Magnitudes{};
  return Slots();
}

absl::Status Optimizer::Apply(absl::Span<float> weights, absl::Span<const float> grad,
                              float learning_rate, int64_t step, ApplyThreads* threads,
                              float max_abs_grad) {
  ScopedFlushDenormals flush;  // the apply threads flush denormals too
  if (static_cast<int64_t>(weights.size()) != size_ || grad.size() != weights.size()) {
    return absl::InvalidArgumentError(absl::StrCat("an update of ", weights.size(),
                                                   " weights with ", grad.size(),
                                                   " gradients for an optimizer of ", size_));
  }
  const int64_t n = size_;
  const int parts = threads != nullptr ? threads->Parts(n) : 1;
  auto run = [&](absl::FunctionRef<void(int, int64_t, int64_t)> fn) {
    if (threads != nullptr) {
      threads->Run(n, fn);
    } else {
      fn(0, 0, n);
    }
  };
  const double bound = Bound(learning_rate, step, max_abs_grad, magnitudes_);
  if (!(bound < kProvenFinite)) {
    std::vector<int64_t> bad(parts, -1);
    run([&](int part, int64_t begin, int64_t end) {
      int64_t first = FirstNonFinite(weights.subspan(begin, end - begin),
                                     grad.subspan(begin, end - begin), begin, learning_rate, step);
      if (first >= 0) bad[part] = begin + first;
    });
    for (int64_t first : bad) {
      if (first < 0) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "the update would make the weight or ", Name(), " state of element ", first,
          " of the shard non-finite (gradient ", grad[first], "); nothing was changed"));
    }
  }
  std::vector<Magnitudes> found(parts, Magnitudes{0, {0, 0}});
  run([&](int part, int64_t begin, int64_t end) {
    found[part] = Commit(weights.subspan(begin, end - begin), grad.subspan(begin, end - begin),
                         begin, learning_rate, step);
  });
  magnitudes_ = Magnitudes{0, {0, 0}};
  for (const Magnitudes& m : found) {
    magnitudes_.weights = std::max(magnitudes_.weights, m.weights);
    for (int k = 0; k < 2; ++k) magnitudes_.state[k] = std::max(magnitudes_.state[k], m.state[k]);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& c, int64_t size) {
  if (c.name == "sgd") return std::make_unique<Sgd>(size);
  if (c.name == "momentum" || c.name == "nesterov") {
    if (!(c.momentum >= 0 && c.momentum < 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("momentum must be in [0, 1), got ", c.momentum));
    }
    return std::make_unique<Momentum>(size, c.momentum, c.name == "nesterov");
  }
  if (c.name == "adam") {
    if (!(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1 && c.epsilon > 0)) {
      return absl::InvalidArgumentError("adam needs beta1, beta2 in [0, 1) and epsilon > 0");
    }
    return std::make_unique<Adam>(size, c);
  }
  if (c.name == "adagrad") {
    if (!(c.epsilon > 0)) return absl::InvalidArgumentError("adagrad needs epsilon > 0");
    return std::make_unique<AdaGrad>(size, c.epsilon);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown optimizer '", c.name, "': expected sgd, momentum, nesterov, adam or adagrad"));
}

}  // namespace ps
