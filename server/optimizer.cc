#include "server/optimizer.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

// Each algorithm is written once: Prepare(lr, step) computes what is constant for one update, and
// Update<kCommit>(i, w, g, offset, params) computes element i's new weight and state, returns
// whether they are finite, and writes them (w and the state) only when kCommit. Kernel<> runs it
// as the dry-run check and as the commit.
template <typename Algorithm>
class Kernel : public Optimizer {
 protected:
  int64_t FirstNonFinite(absl::Span<const float> w, absl::Span<const float> g, int64_t offset,
                         float lr, int64_t step) override {
    auto& self = static_cast<Algorithm&>(*this);
    const auto params = self.Prepare(lr, step);
    bool finite = true;
    for (size_t i = 0; i < w.size(); ++i) {
      float copy = w[i];
      finite &= self.template Update<false>(i, copy, g[i], offset, params);
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
  void Commit(absl::Span<float> w, absl::Span<const float> g, int64_t offset, float lr,
              int64_t step) override {
    auto& self = static_cast<Algorithm&>(*this);
    const auto params = self.Prepare(lr, step);
    for (size_t i = 0; i < w.size(); ++i) self.template Update<true>(i, w[i], g[i], offset, params);
  }
};

// w -= lr * g
class Sgd : public Kernel<Sgd> {
 public:
  std::string Name() const override { return "sgd"; }
  std::vector<std::pair<std::string, absl::Span<float>>> State() override { return {}; }
  float Prepare(float lr, int64_t) const { return lr; }
  template <bool kCommit>
  bool Update(size_t, float& w, float g, int64_t, float lr) {
    float nw = w - lr * g;
    if (kCommit) w = nw;
    return std::isfinite(nw);
  }
};

// Heavy ball: v = mu * v + g; w -= lr * v. Nesterov: w -= lr * (g + mu * v) (PyTorch's form).
class Momentum : public Kernel<Momentum> {
 public:
  Momentum(int64_t size, float mu, bool nesterov) : v_(size, 0.0f), mu_(mu), nesterov_(nesterov) {}
  std::string Name() const override { return nesterov_ ? "nesterov" : "momentum"; }
  std::vector<std::pair<std::string, absl::Span<float>>> State() override {
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

 private:
  std::vector<float> v_;
  float mu_;
  bool nesterov_;
};

// Adam (Kingma & Ba) with bias correction by the shard's update count.
class Adam : public Kernel<Adam> {
 public:
  Adam(int64_t size, const OptimizerConfig& c) : m_(size, 0.0f), v_(size, 0.0f), c_(c) {}
  std::string Name() const override { return "adam"; }
  std::vector<std::pair<std::string, absl::Span<float>>> State() override {
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

 private:
  std::vector<float> m_, v_;
  OptimizerConfig c_;
};

// AdaGrad: s += g^2; w -= lr * g / (sqrt(s) + eps).
class AdaGrad : public Kernel<AdaGrad> {
 public:
  AdaGrad(int64_t size, float eps) : s_(size, 0.0f), eps_(eps) {}
  std::string Name() const override { return "adagrad"; }
  std::vector<std::pair<std::string, absl::Span<float>>> State() override {
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

 private:
  std::vector<float> s_;
  float eps_;
};

}  // namespace

absl::Status Optimizer::Apply(absl::Span<float> weights, absl::Span<const float> grad,
                              int64_t state_offset, float learning_rate, int64_t step) {
  if (int64_t bad = FirstNonFinite(weights, grad, state_offset, learning_rate, step); bad >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the update would make the weight or ", Name(), " state of element ", state_offset + bad,
        " of the shard non-finite (gradient ", grad[bad], "); nothing was changed"));
  }
  Commit(weights, grad, state_offset, learning_rate, step);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& c, int64_t size) {
  if (c.name == "sgd") return std::make_unique<Sgd>();
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
