#include "server/optimizer.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

// w -= lr * g
class Sgd : public Optimizer {
 public:
  std::string Name() const override { return "sgd"; }
  void Apply(absl::Span<float> w, absl::Span<const float> g, int64_t, float lr, int64_t) override {
    for (size_t i = 0; i < w.size(); ++i) w[i] -= lr * g[i];
  }
};

// Heavy ball: v = mu * v + g; w -= lr * v. Nesterov: w -= lr * (g + mu * v) (PyTorch's form).
class Momentum : public Optimizer {
 public:
  Momentum(int64_t size, float mu, bool nesterov) : v_(size, 0.0f), mu_(mu), nesterov_(nesterov) {}
  std::string Name() const override { return nesterov_ ? "nesterov" : "momentum"; }
  void Apply(absl::Span<float> w, absl::Span<const float> g, int64_t offset, float lr,
             int64_t) override {
    float* v = v_.data() + offset;
    for (size_t i = 0; i < w.size(); ++i) {
      v[i] = mu_ * v[i] + g[i];
      w[i] -= lr * (nesterov_ ? g[i] + mu_ * v[i] : v[i]);
    }
  }

 private:
  std::vector<float> v_;
  float mu_;
  bool nesterov_;
};

// Adam (Kingma & Ba) with bias correction by the shard's update count.
class Adam : public Optimizer {
 public:
  Adam(int64_t size, const OptimizerConfig& c) : m_(size, 0.0f), v_(size, 0.0f), c_(c) {}
  std::string Name() const override { return "adam"; }
  void Apply(absl::Span<float> w, absl::Span<const float> g, int64_t offset, float lr,
             int64_t step) override {
    double t = static_cast<double>(step + 1);
    float correction1 = static_cast<float>(1.0 - std::pow(c_.beta1, t));
    float correction2 = static_cast<float>(1.0 - std::pow(c_.beta2, t));
    float* m = m_.data() + offset;
    float* v = v_.data() + offset;
    for (size_t i = 0; i < w.size(); ++i) {
      m[i] = c_.beta1 * m[i] + (1 - c_.beta1) * g[i];
      v[i] = c_.beta2 * v[i] + (1 - c_.beta2) * g[i] * g[i];
      w[i] -= lr * (m[i] / correction1) / (std::sqrt(v[i] / correction2) + c_.epsilon);
    }
  }

 private:
  std::vector<float> m_, v_;
  OptimizerConfig c_;
};

// AdaGrad: s += g^2; w -= lr * g / (sqrt(s) + eps).
class AdaGrad : public Optimizer {
 public:
  AdaGrad(int64_t size, float eps) : s_(size, 0.0f), eps_(eps) {}
  std::string Name() const override { return "adagrad"; }
  void Apply(absl::Span<float> w, absl::Span<const float> g, int64_t offset, float lr,
             int64_t) override {
    float* s = s_.data() + offset;
    for (size_t i = 0; i < w.size(); ++i) {
      s[i] += g[i] * g[i];
      w[i] -= lr * g[i] / (std::sqrt(s[i]) + eps_);
    }
  }

 private:
  std::vector<float> s_;
  float eps_;
};

}  // namespace

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
