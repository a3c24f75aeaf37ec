#include "server/optimizer.h"

#include <gtest/gtest.h>

#include <vector>

namespace ps {
namespace {

// Applies `steps` updates of gradient g to a single weight starting at 1.
std::vector<float> ApplySteps(const std::string& name, const std::vector<float>& grads,
                              float lr = 0.1f) {
  OptimizerConfig c;
  c.name = name;
  auto opt = MakeOptimizer(c, 1);
  EXPECT_TRUE(opt.ok()) << opt.status();
  std::vector<float> w = {1.0f}, trace;
  for (size_t t = 0; t < grads.size(); ++t) {
    EXPECT_TRUE((*opt)->Apply(absl::MakeSpan(w), absl::MakeConstSpan(&grads[t], 1), 0, lr, t).ok());
    trace.push_back(w[0]);
  }
  return trace;
}

TEST(OptimizerTest, SgdMatchesHandComputedValues) {
  std::vector<float> w = ApplySteps("sgd", {0.5f, -1.0f});
  EXPECT_FLOAT_EQ(w[0], 0.95f);  // 1 - 0.1*0.5
  EXPECT_FLOAT_EQ(w[1], 1.05f);  // 0.95 + 0.1
}

TEST(OptimizerTest, MomentumMatchesHandComputedValues) {
  std::vector<float> w = ApplySteps("momentum", {0.5f, 0.5f});
  EXPECT_FLOAT_EQ(w[0], 0.95f);   // v=0.5
  EXPECT_FLOAT_EQ(w[1], 0.855f);  // v=0.9*0.5+0.5=0.95
}

TEST(OptimizerTest, NesterovMatchesHandComputedValues) {
  std::vector<float> w = ApplySteps("nesterov", {0.5f, 0.5f});
  EXPECT_FLOAT_EQ(w[0], 0.905f);            // v=0.5; step g+0.9v=0.95
  EXPECT_FLOAT_EQ(w[1], 0.905f - 0.1355f);  // v=0.95; step 0.5+0.855=1.355
}

TEST(OptimizerTest, AdamMatchesHandComputedValues) {
  // Bias-corrected first step moves by lr * g/|g|; the second with the same g too.
  std::vector<float> w = ApplySteps("adam", {0.5f, 0.5f});
  EXPECT_NEAR(w[0], 0.9f, 1e-6);
  EXPECT_NEAR(w[1], 0.8f, 1e-6);
  // A gradient of the other sign after one step: m=0.05*0.9-0.1*0.5... computed in double:
  double m = 0.9 * 0.05 + 0.1 * -0.5, v = 0.999 * 0.00025 + 0.001 * 0.25;
  double step = 0.1 * (m / (1 - 0.81)) / (std::sqrt(v / (1 - 0.998001)) + 1e-8);
  EXPECT_NEAR(ApplySteps("adam", {0.5f, -0.5f})[1], 0.9 - step, 1e-6);
}

TEST(OptimizerTest, AdaGradMatchesHandComputedValues) {
  std::vector<float> w = ApplySteps("adagrad", {0.5f, 0.5f});
  EXPECT_NEAR(w[0], 0.9f, 1e-6);                            // s=0.25
  EXPECT_NEAR(w[1], 0.9f - 0.05f / std::sqrt(0.5f), 1e-6);  // s=0.5
}

TEST(OptimizerTest, StateIsPerElementAtItsOffset) {
  OptimizerConfig c;
  c.name = "momentum";
  auto opt = MakeOptimizer(c, 4);
  ASSERT_TRUE(opt.ok());
  std::vector<float> w = {1, 1, 1, 1}, g = {1, 1};
  ASSERT_TRUE(
      (*opt)->Apply(absl::MakeSpan(w).subspan(2, 2), g, 2, 0.1f, 0).ok());  // velocity of 2,3 only
  ASSERT_TRUE((*opt)
                  ->Apply(absl::MakeSpan(w).subspan(0, 2), g, 0, 0.1f, 1)
                  .ok());  // fresh velocity for 0,1
  EXPECT_FLOAT_EQ(w[0], 0.9f);
  EXPECT_FLOAT_EQ(w[2], 0.9f);
  ASSERT_TRUE((*opt)->Apply(absl::MakeSpan(w).subspan(2, 2), g, 2, 0.1f, 2).ok());
  EXPECT_FLOAT_EQ(w[2], 0.9f - 0.19f);
  EXPECT_FLOAT_EQ(w[0], 0.9f);
}

TEST(OptimizerTest, RejectsUnknownNamesAndBadHyperParameters) {
  OptimizerConfig c;
  c.name = "rmsprop";
  EXPECT_EQ(MakeOptimizer(c, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(MakeOptimizer(c, 1).status().message().find("unknown optimizer 'rmsprop'"),
            std::string::npos);
  c.name = "momentum";
  c.momentum = 1.5f;
  EXPECT_FALSE(MakeOptimizer(c, 1).ok());
}

}  // namespace
}  // namespace ps
