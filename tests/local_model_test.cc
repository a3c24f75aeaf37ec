// The worker's side of easgd and local SGD (client/local_model.h) against hand-computed values, and
// the consistency grammar (common/consistency_spec.h).
#include "client/local_model.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/consistency_spec.h"

namespace ps {
namespace {

using Floats = std::vector<float>;

TEST(LocalModelTest, StepsAreSgdWithMomentum) {
  Floats x = {1, 2};
  LocalModel model(absl::MakeSpan(x), 0.5f);
  model.Step(Floats{1, 1}, 0.1f);  // v = (1, 1)
  EXPECT_FLOAT_EQ(x[0], 0.9f);
  EXPECT_FLOAT_EQ(x[1], 1.9f);
  model.Step(Floats{2, 0}, 0.1f);  // v = 0.5 v + g = (2.5, 0.5)
  EXPECT_FLOAT_EQ(x[0], 0.65f);
  EXPECT_FLOAT_EQ(x[1], 1.85f);
}

TEST(LocalModelTest, AnElasticExchangeMovesTheModelByWhatItGivesTheCentre) {
  Floats x = {1, 3, -2};
  LocalModel model(absl::MakeSpan(x), 0.9f);
  Floats centre = {0, 1, 2}, diff(3);
  model.Elastic(centre, 0.25f, absl::MakeSpan(diff));
  EXPECT_EQ(diff, (Floats{0.25f, 0.5f, -1}));  // alpha (x - centre)
  EXPECT_EQ(x, (Floats{0.75f, 2.5f, -1}));     // x - diff
}

TEST(LocalModelTest, TheChangeIsMeasuredFromTheLastRestart) {
  Floats x = {1, 1};
  LocalModel model(absl::MakeSpan(x), 0);
  model.Step(Floats{1, -1}, 1);  // steps before the restart do not count
  x = {5, 5};                    // the worker pulls the centre into x and restarts from it
  model.Restart();
  model.Step(Floats{1, -2}, 0.5f);
  Floats change(2);
  model.Change(absl::MakeSpan(change));
  EXPECT_EQ(change, (Floats{-0.5f, 1}));
}

TEST(ConsistencySpecTest, ParsesEveryModelAndWritesItBackCanonically) {
  for (const char* text :
       {"async", "sync", "ssp:0", "ssp:12", "easgd:4", "easgd:4,0.225", "local:1", "local:1000"}) {
    absl::StatusOr<ConsistencySpec> spec = ParseConsistencySpec(text);
    ASSERT_TRUE(spec.ok()) << text << ": " << spec.status();
    EXPECT_EQ(ConsistencyText(*spec), text);
  }
  ConsistencySpec easgd = *ParseConsistencySpec("easgd:8,0.5");
  EXPECT_EQ(easgd.kind, ConsistencySpec::Kind::kEasgd);
  EXPECT_EQ(easgd.period, 8);
  EXPECT_DOUBLE_EQ(easgd.alpha, 0.5);
  EXPECT_TRUE(easgd.local_models());
  EXPECT_FALSE(easgd.rounds());
  ConsistencySpec local = *ParseConsistencySpec("local:16");
  EXPECT_TRUE(local.local_models());
  EXPECT_TRUE(local.rounds());
  EXPECT_TRUE(ParseConsistencySpec("sync")->rounds());
  EXPECT_FALSE(ParseConsistencySpec("ssp:3")->local_models());
}

TEST(ConsistencySpecTest, BadTextsNameWhatIsWrong) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& c : {Case{"bsp", "no such model"}, Case{"ssp:-1", "S must be"},
                        Case{"ssp", "missing its parameter"}, Case{"sync:2", "takes no parameter"},
                        Case{"easgd:0", "T must be"}, Case{"easgd:1001", "T must be"},
                        Case{"easgd:4,1", "A must be"}, Case{"easgd:4,nan", "A must be"},
                        Case{"easgd:4,0.1,2", "T must be"}, Case{"local:x", "H must be"},
                        Case{"local:2,3", "H must be"}, Case{"", "no such model"}}) {
    absl::StatusOr<ConsistencySpec> spec = ParseConsistencySpec(c.text);
    ASSERT_FALSE(spec.ok()) << c.text;
    EXPECT_NE(spec.status().message().find(c.says), std::string::npos) << spec.status();
    EXPECT_NE(spec.status().message().find("unknown consistency model"), std::string::npos);
  }
}

}  // namespace
}  // namespace ps
