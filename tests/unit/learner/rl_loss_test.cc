// The RL policy loss against independent oracles: fp64 central finite differences of the loss
// for the gradient, and a scalar re-statement of spec/rl.md §2 for the value.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "learner/rl/advantage.h"
#include "learner/rl/policy_loss.h"

namespace orrery::rl {
namespace {

struct Problem {
  Tensor logits;  // f64 [N, V]
  PolicyLossInput input;
};

// N tokens over `seqs` sequences; logprobs of μ and π_prox are the current policy's perturbed by
// up to `spread` nats so ratios and weights cover both sides of the clip and the caps.
Problem MakeProblem(int n, int v, int seqs, double spread, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uni(-spread, spread);
  Problem p;
  p.logits = Tensor::Empty({n, v}, DType::kF64);
  double* z = p.logits.data<double>();
  for (int i = 0; i < n * v; ++i) z[i] = normal(rng);
  for (int i = 0; i < n; ++i) {
    const int y = static_cast<int>(rng() % v);
    double mx = -1e300, s = 0;
    for (int j = 0; j < v; ++j) mx = std::max(mx, z[i * v + j]);
    for (int j = 0; j < v; ++j) s += std::exp(z[i * v + j] - mx);
    const double logp = z[i * v + y] - mx - std::log(s);
    p.input.targets.push_back(y);
    p.input.mask.push_back(i % 5 == 0 ? 0 : 1);
    p.input.proximal_logprobs.push_back(static_cast<float>(logp + uni(rng)));
    p.input.behaviour_logprobs.push_back(static_cast<float>(logp + uni(rng)));
    p.input.ref_logprobs.push_back(static_cast<float>(logp + uni(rng)));
    p.input.sequence_ids.push_back(i * seqs / n);
    p.input.advantages.push_back(static_cast<float>(normal(rng)));
  }
  return p;
}

double LossAt(const PolicyLossOptions& o, const Tensor& logits, const PolicyLossInput& in) {
  auto s = PolicyLoss(o, logits, in, 1.0, nullptr);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s->loss_sum;
}

void CheckGradient(const PolicyLossOptions& o, uint32_t seed) {
  Problem p = MakeProblem(12, 7, 3, 0.5, seed);
  const double scale = 1.0 / 9.0;
  Tensor dz;
  ASSERT_TRUE(PolicyLoss(o, p.logits, p.input, scale, &dz).ok());
  double* z = p.logits.data<double>();
  const double h = 1e-6;
  double max_err = 0, max_ref = 0;
  int checked = 0;
  for (int64_t k = 0; k < p.logits.numel(); ++k) {
    const double keep = z[k];
    z[k] = keep + h;
    const double up = LossAt(o, p.logits, p.input);
    z[k] = keep - h;
    const double down = LossAt(o, p.logits, p.input);
    z[k] = keep;
    const double fd = scale * (up - down) / (2 * h);
    max_err = std::max(max_err, std::abs(fd - dz.data<double>()[k]));
    max_ref = std::max(max_ref, std::abs(fd));
    ++checked;
  }
  // Central differences in f64 with h = 1e-6 are accurate to ~1e-9 on these O(1) functions; the
  // clip kink is measure-zero for random inputs, so any real error is far above this bound.
  EXPECT_LT(max_err, 1e-7) << "max |fd| " << max_ref << " over " << checked << " entries";
  EXPECT_GT(max_ref, 1e-3);  // the check is not vacuous
}

TEST(RlPolicyLoss, GradientDecoupledPpoTokenTruncate) {
  PolicyLossOptions o;  // the default: AReaL decoupled PPO, w_max = 5
  for (uint32_t seed = 1; seed <= 3; ++seed) CheckGradient(o, seed);
}

TEST(RlPolicyLoss, GradientSequenceMaskWithEntropyAndKl) {
  PolicyLossOptions o;
  o.correction = IsCorrection::kMask;
  o.level = IsLevel::kSequence;
  o.is_cap = 2.0;
  o.entropy_coef = 0.03;
  o.kl_coef = 0.1;
  for (uint32_t seed = 4; seed <= 6; ++seed) CheckGradient(o, seed);
}

TEST(RlPolicyLoss, GradientGeometricTruncateNoCorrection) {
  PolicyLossOptions o;
  o.level = IsLevel::kGeometric;
  o.is_cap = 1.2;
  CheckGradient(o, 7);
  o.correction = IsCorrection::kNone;
  o.clip_low = 0.1;
  o.clip_high = 0.1;
  CheckGradient(o, 8);
}

// A scalar restatement of the spec's formula: the value oracle.
double SpecLoss(const PolicyLossOptions& o, const Problem& p) {
  const int n = static_cast<int>(p.input.targets.size());
  const int v = static_cast<int>(p.logits.dim(1));
  const double* z = p.logits.data<double>();
  double total = 0;
  for (int i = 0; i < n; ++i) {
    if (!p.input.mask[i]) continue;
    double s = 0;
    for (int j = 0; j < v; ++j) s += std::exp(z[i * v + j]);
    const double pi = std::exp(z[i * v + p.input.targets[i]]) / s;
    const double prox = std::exp(static_cast<double>(p.input.proximal_logprobs[i]));
    const double mu = std::exp(static_cast<double>(p.input.behaviour_logprobs[i]));
    const double r = pi / prox;
    const double w = std::min(prox / mu, o.is_cap);
    const double a = p.input.advantages[i];
    const double clipped = std::min(std::max(r, 1 - o.clip_low), 1 + o.clip_high);
    total += -w * std::min(r * a, clipped * a);
  }
  return total;
}

TEST(RlPolicyLoss, ValueMatchesSpecFormula) {
  PolicyLossOptions o;
  o.is_cap = 1.5;
  Problem p = MakeProblem(40, 9, 4, 0.8, 11);
  auto s = PolicyLoss(o, p.logits, p.input, 1.0, nullptr);
  ASSERT_TRUE(s.ok());
  EXPECT_NEAR(s->loss_sum, SpecLoss(o, p), 1e-9 * (1 + std::abs(s->loss_sum)));
  EXPECT_EQ(s->tokens, 32);  // every fifth row is masked out
  EXPECT_GT(s->clipped, 0);  // spread 0.8 nats pushes some ratios past the clip
  EXPECT_LT(s->clipped, s->tokens);
}

TEST(RlPolicyLoss, FreshOnPolicyIsThePolicyGradient) {
  // π_θ = π_prox = μ: w = 1, r = 1, and dL/dz = -A (onehot - softmax) per masked token.
  Problem p = MakeProblem(10, 5, 2, 0.0, 21);
  auto logp = TokenLogprobs(p.logits, p.input.targets);
  ASSERT_TRUE(logp.ok());
  p.input.proximal_logprobs = *logp;
  p.input.behaviour_logprobs = *logp;
  Tensor dz;
  auto s = PolicyLoss(PolicyLossOptions{}, p.logits, p.input, 1.0, &dz);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->clipped, 0);
  EXPECT_NEAR(s->is_weight_mean(), 1.0, 1e-6);
  EXPECT_NEAR(s->is_weight_std(), 0.0, 1e-6);
  EXPECT_NEAR(s->is_weight_ess(), 1.0, 1e-9);
  const double* z = p.logits.data<double>();
  for (int i = 0; i < 10; ++i) {
    double sum = 0;
    for (int j = 0; j < 5; ++j) sum += std::exp(z[i * 5 + j]);
    for (int j = 0; j < 5; ++j) {
      const double pj = std::exp(z[i * 5 + j]) / sum;
      const double want =
          p.input.mask[i] ? -p.input.advantages[i] * ((j == p.input.targets[i] ? 1.0 : 0.0) - pj)
                          : 0.0;
      // The ratio exp(logp - prox) passes through f32 logprobs: ~1e-7 relative.
      EXPECT_NEAR(dz.data<double>()[i * 5 + j], want, 1e-6);
    }
  }
}

TEST(RlPolicyLoss, ClipZeroesGradientAndMaskDropsTokens) {
  Problem p = MakeProblem(2, 4, 2, 0.0, 31);
  p.input.mask = {1, 1};
  auto logp = TokenLogprobs(p.logits, p.input.targets);
  ASSERT_TRUE(logp.ok());
  // Token 0: ratio e^1 > 1 + ε_high with A > 0: clipped, no gradient.
  p.input.proximal_logprobs = {(*logp)[0] - 1.0f, (*logp)[1]};
  p.input.behaviour_logprobs = p.input.proximal_logprobs;
  p.input.advantages = {1.0f, 1.0f};
  Tensor dz;
  auto s = PolicyLoss(PolicyLossOptions{}, p.logits, p.input, 1.0, &dz);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->clipped, 1);
  for (int j = 0; j < 4; ++j) EXPECT_EQ(dz.data<double>()[j], 0.0);
  // The same token with A < 0 is not clipped (min picks the unclipped, more pessimistic branch).
  p.input.advantages = {-1.0f, 1.0f};
  s = PolicyLoss(PolicyLossOptions{}, p.logits, p.input, 1.0, &dz);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->clipped, 0);

  // MIS at token level: behaviour 3 nats below proximal is outside [1/2, 2]: dropped.
  PolicyLossOptions mis;
  mis.correction = IsCorrection::kMask;
  mis.is_cap = 2.0;
  p.input.proximal_logprobs = *logp;
  p.input.behaviour_logprobs = {(*logp)[0] - 3.0f, (*logp)[1]};
  s = PolicyLoss(mis, p.logits, p.input, 1.0, &dz);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->is_masked, 1);
  EXPECT_EQ(s->is_weight_sum, 1);
  EXPECT_NEAR(s->is_weight_ess(), 0.5, 1e-12);  // (0 + 1)² / (2 · 1)
  for (int j = 0; j < 4; ++j) EXPECT_EQ(dz.data<double>()[j], 0.0);
  // TIS caps the same weight at C.
  PolicyLossOptions tis;
  tis.is_cap = 2.0;
  p.input.behaviour_logprobs = {(*logp)[0] - 3.0f, (*logp)[1]};
  s = PolicyLoss(tis, p.logits, p.input, 1.0, nullptr);
  ASSERT_TRUE(s.ok());
  EXPECT_NEAR(s->is_weight_sum, 3.0, 1e-9);
}

TEST(RlPolicyLoss, F32AgreesWithF64) {
  Problem p = MakeProblem(30, 11, 3, 0.3, 41);
  auto f32 = p.logits.Cast(DType::kF32);
  ASSERT_TRUE(f32.ok());
  Tensor d64, d32;
  auto s64 = PolicyLoss(PolicyLossOptions{}, p.logits, p.input, 0.1, &d64);
  auto s32 = PolicyLoss(PolicyLossOptions{}, *f32, p.input, 0.1, &d32);
  ASSERT_TRUE(s64.ok() && s32.ok());
  EXPECT_NEAR(s32->loss_sum, s64->loss_sum, 1e-4);
  EXPECT_EQ(d32.dtype(), DType::kF32);
  for (int64_t k = 0; k < d64.numel(); ++k) {
    EXPECT_NEAR(d32.data<float>()[k], d64.data<double>()[k], 1e-5);
  }
}

TEST(RlPolicyLoss, BadInputIsOneClearError) {
  Problem p = MakeProblem(4, 3, 1, 0.1, 51);
  p.input.advantages.pop_back();
  auto s = PolicyLoss(PolicyLossOptions{}, p.logits, p.input, 1.0, nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("one entry per logit row"), std::string::npos);
  p = MakeProblem(4, 3, 1, 0.1, 51);
  p.input.targets[1] = 3;
  EXPECT_FALSE(PolicyLoss(PolicyLossOptions{}, p.logits, p.input, 1.0, nullptr).ok());
  PolicyLossOptions bad;
  bad.is_cap = 1.0;
  EXPECT_FALSE(ValidatePolicyLossOptions(bad).ok());
  EXPECT_FALSE(ParseIsLevel("tokens").ok());
  EXPECT_FALSE(ParseIsCorrection("clip").ok());
}

TEST(RlAdvantage, GroupRelative) {
  const std::vector<double> r = {1, 0, 0, 1};
  auto a = GroupAdvantages(AdvantageKind::kGrpo, r);
  // mean 0.5, population std 0.5.
  EXPECT_NEAR(a[0], 1.0, 1e-5);
  EXPECT_NEAR(a[1], -1.0, 1e-5);
  auto d = GroupAdvantages(AdvantageKind::kDrGrpo, r);
  EXPECT_DOUBLE_EQ(d[0], 0.5);
  auto l = GroupAdvantages(AdvantageKind::kRloo, {3, 0, 0});
  EXPECT_DOUBLE_EQ(l[0], 3.0);
  EXPECT_DOUBLE_EQ(l[1], -1.5);
  for (double x : GroupAdvantages(AdvantageKind::kGrpo, {1, 1, 1})) EXPECT_EQ(x, 0.0);
  for (double x : GroupAdvantages(AdvantageKind::kRloo, {1})) EXPECT_EQ(x, 0.0);
  EXPECT_FALSE(ParseAdvantageKind("ppo").ok());
}

}  // namespace
}  // namespace orrery::rl
