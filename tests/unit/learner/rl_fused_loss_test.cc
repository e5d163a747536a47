// The fused LM head + policy loss (kernels/lm_head_policy_loss.h, CPU twin) against its oracle,
// the host PolicyLoss (learner/rl/policy_loss.h) over the explicit [N, V] logits: loss, every
// statistic, log π, and dx / dW through the products the host model's LM head backward makes.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/lm_head_policy_loss.h"
#include "kernels/matmul.h"
#include "learner/rl/policy_loss.h"
#include "tests/gpu/policy_loss_check.h"

namespace orrery::rl {
namespace {

using kernels::testing::RelRmsError;

struct Oracle {
  PolicyLossStats stats;
  Tensor dx, dw;
  std::vector<float> logp;
};

// The unfused path in f64: logits = x W^T / T, PolicyLoss, then the LM head's two products with
// dlogits / T (the trainer's temperature scaling).
Oracle Explicit(const policy_check::Case& c) {
  Oracle o;
  const int64_t n = c.x.dim(0), v = c.w.dim(0);
  Tensor logits = Tensor::Empty({n, v}, DType::kF64);
  EXPECT_TRUE(kernels::Matmul(c.x, c.w, {false, true, 1.0f, 0.0f}, &logits).ok());
  for (int64_t i = 0; i < logits.numel(); ++i) logits.data<double>()[i] /= c.temperature;
  Tensor dlogits;
  o.stats = PolicyLoss(c.options, logits, c.in, c.grad_scale, &dlogits).value();
  for (int64_t i = 0; i < dlogits.numel(); ++i) dlogits.data<double>()[i] /= c.temperature;
  o.dx = Tensor::Empty(c.x.shape(), DType::kF64);
  o.dw = Tensor::Empty(c.w.shape(), DType::kF64);
  EXPECT_TRUE(kernels::Matmul(dlogits, c.w, {false, false, 1.0f, 0.0f}, &o.dx).ok());
  EXPECT_TRUE(kernels::Matmul(dlogits, c.x, {true, false, 1.0f, 0.0f}, &o.dw).ok());
  o.logp = TokenLogprobs(logits, c.in.targets).value();
  return o;
}

// f64 on both sides with the same row maths: they differ in summation order (~1e-15) and in the
// behaviour weight, an f32 input of the op (rounded by up to 2^-24 = 6e-8 relative) where the
// host keeps it in f64: 3e-7 on the sums and gradients is 5x that rounding and a million times
// below a wrong term. Counts (tokens, clipped) are exact.
TEST(FusedPolicyLoss, CpuTwinMatchesHostPolicyLoss) {
  constexpr double kTol = 3e-7;
  int seed = 0;
  double clipped = 0, is_masked = 0;
  for (const PolicyLossOptions& options : policy_check::OptionSweep()) {
    SCOPED_TRACE(seed);
    const policy_check::Case c = policy_check::RandomCase(300, 24, 97, 100 + seed++, options);
    const Oracle want = Explicit(c);
    PolicyLossStats host;
    (void)BehaviourWeights(c.options, c.in, &host).value();
    kernels::PolicyRowSums got;
    Tensor logp, dx, dw = Tensor::Zeros(c.w.shape(), DType::kF64);
    const Status st =
        kernels::LmHeadPolicyLoss(c.x, c.w, policy_check::Rows(c, Device::Cpu()),
                                  policy_check::OpOptions(c, 64), &got, &logp, &dx, &dw);
    ASSERT_TRUE(st.ok()) << st.ToString();
    const PolicyLossStats& s = want.stats;
    EXPECT_NEAR(got.loss_sum, s.loss_sum, kTol * std::abs(s.loss_sum));
    EXPECT_EQ(got.tokens, s.tokens);
    EXPECT_EQ(got.clipped, s.clipped);
    EXPECT_NEAR(got.entropy_sum, s.entropy_sum, kTol * s.entropy_sum);
    EXPECT_NEAR(got.ratio_sum, s.ratio_sum, kTol * s.ratio_sum);
    EXPECT_NEAR(got.approx_kl_sum, s.approx_kl_sum, kTol * s.approx_kl_sum + 1e-12);
    EXPECT_NEAR(got.ref_kl_sum, s.ref_kl_sum, kTol * s.ref_kl_sum + 1e-12);
    EXPECT_EQ(host.is_weight_sum, s.is_weight_sum);
    EXPECT_EQ(host.is_weight_sq_sum, s.is_weight_sq_sum);
    EXPECT_EQ(host.is_masked, s.is_masked);
    EXPECT_LT(RelRmsError(dx, want.dx), kTol);
    EXPECT_LT(RelRmsError(dw, want.dw), kTol);
    for (size_t i = 0; i < want.logp.size(); ++i) {
      EXPECT_NEAR(logp.data<float>()[i], c.in.mask[i] ? want.logp[i] : 0.0f, 1e-5) << i;
    }
    clipped += s.clipped;
    is_masked += s.is_masked;
    EXPECT_EQ(s.ref_kl_sum > 0, options.kl_coef > 0);
  }
  // The cases exercise the clip and MIS masking (else the comparison proves less).
  EXPECT_GT(clipped, 20);
  EXPECT_GT(is_masked, 20);
}

// f32 inputs: the twin's logits are f32 products, its row maths still f64; the host's loss on f32
// logits of the same products agrees to f32 rounding of the logits (~1e-7 relative per element).
TEST(FusedPolicyLoss, F32CpuTwinMatchesHostPolicyLoss) {
  const policy_check::Case c = policy_check::RandomCase(200, 16, 61, 7, PolicyLossOptions());
  const Oracle want = Explicit(c);
  kernels::PolicyRowSums got;
  Tensor dx, dw = Tensor::Zeros(c.w.shape(), DType::kF32);
  const Tensor x32 = c.x.Cast(DType::kF32).value(), w32 = c.w.Cast(DType::kF32).value();
  ASSERT_TRUE(kernels::LmHeadPolicyLoss(x32, w32, policy_check::Rows(c, Device::Cpu()),
                                        policy_check::OpOptions(c, 50), &got, nullptr, &dx, &dw)
                  .ok());
  EXPECT_NEAR(got.loss_sum, want.stats.loss_sum, 1e-5 * std::abs(want.stats.loss_sum));
  EXPECT_EQ(got.clipped, want.stats.clipped);
  EXPECT_LT(RelRmsError(dx, want.dx), 1e-5);
  EXPECT_LT(RelRmsError(dw, want.dw), 1e-5);
}

// The forward-only pass (π_prox): TokenLogprobs and its entropies on the temperature-scaled
// logits, for the masked rows.
TEST(FusedPolicyLoss, TokenLogprobsMatchHost) {
  const policy_check::Case c = policy_check::RandomCase(150, 16, 53, 9, PolicyLossOptions());
  const int64_t n = c.x.dim(0), v = c.w.dim(0);
  Tensor logits = Tensor::Empty({n, v}, DType::kF64);
  ASSERT_TRUE(kernels::Matmul(c.x, c.w, {false, true, 1.0f, 0.0f}, &logits).ok());
  for (int64_t i = 0; i < logits.numel(); ++i) logits.data<double>()[i] /= c.temperature;
  std::vector<float> entropy;
  const std::vector<float> want = TokenLogprobs(logits, c.in.targets, &entropy).value();
  const kernels::PolicyRows rows = policy_check::Rows(c, Device::Cpu());
  Tensor logp, ent;
  ASSERT_TRUE(kernels::LmHeadTokenLogprobs(c.x, c.w, rows.targets, rows.mask,
                                           policy_check::OpOptions(c, 40), &logp, &ent)
                  .ok());
  for (int64_t i = 0; i < n; ++i) {
    const float lp = c.in.mask[i] ? want[i] : 0.0f, h = c.in.mask[i] ? entropy[i] : 0.0f;
    EXPECT_FLOAT_EQ(logp.data<float>()[i], lp) << i;
    EXPECT_FLOAT_EQ(ent.data<float>()[i], h) << i;
  }
}

TEST(FusedPolicyLoss, MaskedTargetOutsideTheVocabularyFails) {
  policy_check::Case c = policy_check::RandomCase(20, 8, 11, 3, PolicyLossOptions());
  kernels::PolicyRows rows = policy_check::Rows(c, Device::Cpu());
  rows.targets.data<int32_t>()[4] = 11;
  kernels::PolicyRowSums sums;
  const Status st = kernels::LmHeadPolicyLoss(c.x, c.w, rows, policy_check::OpOptions(c, 8), &sums,
                                              nullptr, nullptr, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.ToString();
  EXPECT_NE(st.message().find("targets[4] = 11"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace orrery::rl
