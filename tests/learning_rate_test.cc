#include "server/state/learning_rate.h"

#include <gtest/gtest.h>

namespace ps {
namespace {

LearningRateSchedule Make(LearningRateConfig c) { return *LearningRateSchedule::Create(c); }

TEST(LearningRateTest, ConstantWithWarmup) {
  LearningRateConfig c;
  c.base = 0.1f;
  c.warmup_updates = 4;
  LearningRateSchedule s = Make(c);
  EXPECT_FLOAT_EQ(s.At(0), 0.025f);
  EXPECT_FLOAT_EQ(s.At(3), 0.1f);
  EXPECT_FLOAT_EQ(s.At(1000), 0.1f);
}

TEST(LearningRateTest, StepDecay) {
  LearningRateConfig c;
  c.base = 0.8f;
  c.schedule = "step";
  c.step_updates = 10;
  c.gamma = 0.5f;
  LearningRateSchedule s = Make(c);
  EXPECT_FLOAT_EQ(s.At(9), 0.8f);
  EXPECT_FLOAT_EQ(s.At(10), 0.4f);
  EXPECT_FLOAT_EQ(s.At(35), 0.1f);
}

TEST(LearningRateTest, CosineDecayAfterWarmup) {
  LearningRateConfig c;
  c.base = 1.0f;
  c.schedule = "cosine";
  c.warmup_updates = 10;
  c.total_updates = 110;
  LearningRateSchedule s = Make(c);
  EXPECT_FLOAT_EQ(s.At(10), 1.0f);
  EXPECT_NEAR(s.At(60), 0.5f, 1e-6);
  EXPECT_NEAR(s.At(110), 0.0f, 1e-6);
  EXPECT_NEAR(s.At(500), 0.0f, 1e-6);
}

TEST(LearningRateTest, RejectsBadConfigurations) {
  LearningRateConfig c;
  c.base = 0;
  EXPECT_FALSE(LearningRateSchedule::Create(c).ok());
  c.base = 0.1f;
  c.schedule = "cosine";
  c.total_updates = 0;
  EXPECT_FALSE(LearningRateSchedule::Create(c).ok());
  c.schedule = "step";
  c.gamma = 2;
  EXPECT_FALSE(LearningRateSchedule::Create(c).ok());
}

}  // namespace
}  // namespace ps
