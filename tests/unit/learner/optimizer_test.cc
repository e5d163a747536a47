#include <gtest/gtest.h>

#include <cmath>

#include "learner/adamw.h"
#include "learner/cross_entropy.h"
#include "learner/lr_schedule.h"

namespace orrery {
namespace {

ParamRef MakeParam(const std::string& name, std::vector<float> w, std::vector<float> g, bool wd) {
  const int64_t n = static_cast<int64_t>(w.size());
  return ParamRef{name, Tensor::FromVector<float>({n}, w), Tensor::FromVector<float>({n}, g), wd};
}

TEST(AdamWTest, MatchesAnF64ReferenceAndSkipsDecayWhereAsked) {
  AdamWOptions o{0.9, 0.95, 1e-8, 0.1};
  std::vector<ParamRef> params = {MakeParam("w", {1.0f, -2.0f}, {0.5f, 0.25f}, true),
                                  MakeParam("norm", {1.0f, -2.0f}, {0.5f, 0.25f}, false)};
  StatusOr<AdamW> opt = AdamW::Create(o, params);
  ASSERT_TRUE(opt.ok()) << opt.status().ToString();
  // f64 reference of the same update rule, written out independently.
  double w[2][2] = {{1, -2}, {1, -2}}, m[2][2] = {}, v[2][2] = {};
  const double g[2] = {0.5, 0.25}, lr = 0.01;
  for (int t = 1; t <= 3; ++t) {
    ASSERT_TRUE(opt->Step(lr).ok());
    for (int p = 0; p < 2; ++p) {
      for (int i = 0; i < 2; ++i) {
        m[p][i] = 0.9 * m[p][i] + 0.1 * g[i];
        v[p][i] = 0.95 * v[p][i] + 0.05 * g[i] * g[i];
        if (p == 0) w[p][i] -= lr * 0.1 * w[p][i];
        const double mh = m[p][i] / (1 - std::pow(0.9, t)), vh = v[p][i] / (1 - std::pow(0.95, t));
        w[p][i] -= lr * mh / (std::sqrt(vh) + 1e-8);
      }
    }
  }
  for (int p = 0; p < 2; ++p) {
    for (int i = 0; i < 2; ++i) {
      // f32 state and arithmetic against the f64 reference: a few ulps of the values (~1e-7).
      EXPECT_NEAR(params[p].value.data<float>()[i], w[p][i], 1e-6) << p << "," << i;
    }
  }
  EXPECT_NE(params[0].value.data<float>()[0], params[1].value.data<float>()[0]);  // decay differs
  EXPECT_EQ(opt->step(), 3);
}

TEST(AdamWTest, StateRoundTripsAndBadParamsAreRefused) {
  std::vector<ParamRef> params = {MakeParam("w", {1.0f, 2.0f}, {0.1f, 0.2f}, true)};
  AdamW a = *AdamW::Create({}, params);
  ASSERT_TRUE(a.Step(0.1).ok());
  std::map<std::string, Tensor> state;
  for (auto& [k, t] : a.StateTensors()) state[k] = t.Clone();
  std::vector<ParamRef> params2 = {MakeParam("w", {1.0f, 2.0f}, {0.1f, 0.2f}, true)};
  AdamW b = *AdamW::Create({}, params2);
  ASSERT_TRUE(b.LoadState(state, a.step()).ok());
  ASSERT_TRUE(params2[0].value.CopyFrom(params[0].value).ok());
  ASSERT_TRUE(a.Step(0.1).ok());
  ASSERT_TRUE(b.Step(0.1).ok());
  EXPECT_EQ(params[0].value.data<float>()[1], params2[0].value.data<float>()[1]);
  state.erase("adamw.v/w");
  EXPECT_EQ(b.LoadState(state, 1).code(), StatusCode::kDataLoss);
  std::vector<ParamRef> dup = {MakeParam("x", {1}, {1}, true), MakeParam("x", {1}, {1}, true)};
  EXPECT_FALSE(AdamW::Create({}, dup).ok());
}

TEST(GradClipTest, ScalesToTheMaxNormOnlyWhenAbove) {
  std::vector<ParamRef> params = {MakeParam("a", {0, 0}, {3, 0}, true),
                                  MakeParam("b", {0}, {4}, true)};
  EXPECT_DOUBLE_EQ(ClipGradGlobalNorm(params, 10.0), 5.0);
  EXPECT_FLOAT_EQ(params[0].grad.data<float>()[0], 3.0f);
  EXPECT_DOUBLE_EQ(ClipGradGlobalNorm(params, 1.0), 5.0);
  EXPECT_NEAR(GlobalGradNorm(params), 1.0, 1e-6);
  EXPECT_NEAR(params[1].grad.data<float>()[0], 0.8f, 1e-6);
}

TEST(LrScheduleTest, WarmupThenShape) {
  LrScheduleOptions o;
  o.peak_lr = 1.0;
  o.warmup_steps = 10;
  o.total_steps = 110;
  o.min_ratio = 0.1;
  o.decay_fraction = 0.2;
  o.kind = LrScheduleKind::kWsd;
  EXPECT_DOUBLE_EQ(LearningRate(o, 0), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(o, 9), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(o, 50), 1.0);  // stable
  EXPECT_DOUBLE_EQ(LearningRate(o, 88), 1.0);  // decay starts at 110 - 22 = 88
  EXPECT_NEAR(LearningRate(o, 99), 1.0 - 0.9 * 11.0 / 22.0, 1e-12);
  EXPECT_NEAR(LearningRate(o, 110), 0.1, 1e-12);
  o.kind = LrScheduleKind::kCosine;
  EXPECT_NEAR(LearningRate(o, 10), 1.0, 1e-12);
  EXPECT_NEAR(LearningRate(o, 60), 0.55, 1e-12);  // halfway: floor + (peak - floor) / 2
  EXPECT_NEAR(LearningRate(o, 500), 0.1, 1e-12);
  o.kind = LrScheduleKind::kConstant;
  EXPECT_DOUBLE_EQ(LearningRate(o, 100), 1.0);
  EXPECT_FALSE(ParseLrScheduleKind("linear").ok());
}

TEST(CrossEntropyTest, GradientMatchesFiniteDifferences) {
  const int64_t n = 3, v = 5;
  std::vector<float> z;
  for (int i = 0; i < n * v; ++i) z.push_back(static_cast<float>(std::sin(1.3 * i)) * 2.0f);
  const std::vector<int32_t> targets = {2, -1, 4};
  Tensor logits = Tensor::FromVector<float>({n, v}, z);
  Tensor grad;
  StatusOr<LossSum> l = CrossEntropy(logits, targets, 0.5, &grad);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->tokens, 2);
  // Oracle: central differences of 0.5 * loss_sum. h = 1e-2 on f32 logits gives ~1e-5 error
  // (O(h^2) truncation plus f32 rounding of z +- h over 2h), far below the gradient scale.
  for (int64_t k = 0; k < n * v; ++k) {
    const float h = 1e-2f;
    Tensor plus = logits.Clone(), minus = logits.Clone();
    plus.data<float>()[k] += h;
    minus.data<float>()[k] -= h;
    const double fd = 0.5 *
                      (CrossEntropy(plus, targets, 0, nullptr)->loss_sum -
                       CrossEntropy(minus, targets, 0, nullptr)->loss_sum) /
                      (2 * h);
    EXPECT_NEAR(grad.data<float>()[k], fd, 1e-4) << "logit " << k;
  }
  EXPECT_FALSE(CrossEntropy(logits, {0, 1}, 1, nullptr).ok());
  EXPECT_FALSE(CrossEntropy(logits, {0, 1, 5}, 1, nullptr).ok());
}

}  // namespace
}  // namespace orrery
