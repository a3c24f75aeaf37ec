#include "server/learning_rate.h"

#include <gtest/gtest.h>

#include "worker/delay.h"

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

TEST(DelayTest, ParsesAndDrawsSeededDelays) {
  EXPECT_FALSE(Delay::Parse("", 1)->enabled());
  EXPECT_EQ(Delay::Parse("fixed:0.25", 1)->Next(), absl::Milliseconds(250));
  Delay a = *Delay::Parse("uniform:0.1,0.2", 7), b = *Delay::Parse("uniform:0.1,0.2", 7);
  for (int i = 0; i < 100; ++i) {
    absl::Duration d = a.Next();
    EXPECT_EQ(d, b.Next());
    EXPECT_GE(d, absl::Milliseconds(100));
    EXPECT_LE(d, absl::Milliseconds(200));
  }
  Delay e = *Delay::Parse("exp:0.01", 3);
  absl::Duration total;
  for (int i = 0; i < 4000; ++i) total += e.Next();
  EXPECT_NEAR(absl::ToDoubleSeconds(total) / 4000, 0.01, 0.001);
  for (const char* bad : {"fixed", "fixed:-1", "uniform:2,1", "gauss:1", "exp:x"}) {
    EXPECT_FALSE(Delay::Parse(bad, 1).ok()) << bad;
  }
}

}  // namespace
}  // namespace ps
