// The RL learner on CUDA (issue 26): the fused LM head + policy loss kernel
// (kernels/lm_head_policy_loss.h) against its CPU twin on the same random cases as the twin's
// own test against the host PolicyLoss (tests/gpu/policy_loss_check.h), and a few RlTrainer
// updates of the GPU model (f32 and bf16) against the host trainer (tests/gpu/rl_trainer_check.h).
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "kernels/lm_head_policy_loss.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/policy_loss_check.h"
#include "tests/gpu/rl_trainer_check.h"

namespace orrery::rl {
namespace {

using kernels::gpu_test::ExpectClose;
using kernels::gpu_test::kBf16Tol;
using kernels::gpu_test::Poisoned;
using kernels::gpu_test::Round;
using kernels::gpu_test::ToGpu;
using kernels::gpu_test::ToHost;

class FusedPolicyLossGpuTest : public ::testing::TestWithParam<DType> {};

// The CPU twin in f64 on the inputs rounded to the GPU's dtype is the reference. The GPU takes
// the softmax sums in f32 (the token terms in f64): log π and the sums err ~1e-6 relative; the
// clip branch may go the other way for a token whose ratio sits within that of a boundary, so the
// clip count may differ by a token or two. Gradients: f32 ~1e-6 (kF32Tol is 2e-5); bf16 rounds dz
// before both products (~1.7e-3) and dx again (~1.7e-3), inside kBf16Tol.
TEST_P(FusedPolicyLossGpuTest, LossLogprobsAndGradientsMatchCpuTwin) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  int seed = 0;
  for (const PolicyLossOptions& options : policy_check::OptionSweep()) {
    SCOPED_TRACE(seed);
    policy_check::Case c = policy_check::RandomCase(1000, 64, 5003, 300 + seed++, options);
    c.x = Round(c.x, dt);
    c.w = Round(c.w, dt);
    const kernels::LmHeadPolicyOptions o = policy_check::OpOptions(c, 256);  // 4 chunks
    kernels::PolicyRowSums want;
    Tensor logp_ref, dx_ref, dw_ref = Tensor::Zeros(c.w.shape(), DType::kF64);
    ASSERT_TRUE(kernels::LmHeadPolicyLoss(c.x, c.w, policy_check::Rows(c, Device::Cpu()), o, &want,
                                          &logp_ref, &dx_ref, &dw_ref)
                    .ok());

    kernels::PolicyRowSums got;
    Tensor logp = Poisoned({c.x.dim(0)}, DType::kF32);
    Tensor dx = Poisoned(c.x.shape(), dt);
    Tensor dw = ToGpu(Tensor::Zeros(c.w.shape(), DType::kF32));
    const Status st =
        kernels::LmHeadPolicyLoss(ToGpu(c.x, dt), ToGpu(c.w, dt),
                                  policy_check::Rows(c, Device::Cuda(0)), o, &got, &logp, &dx, &dw);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_NEAR(got.clipped, want.clipped, 2);
    const double n = want.tokens;
    // With the KL option set the k3 terms reach ~1e9 per token (exp of random reference
    // log-probabilities against log π down to about -30), so besides the per-token bound the
    // sums get a relative one: the H200 measured 1.1e-6 to 2.9e-6 relative there (session 15).
    const auto bound = [n](double want) { return std::max(1e-5 * n, 1e-5 * std::abs(want)); };
    EXPECT_NEAR(got.loss_sum, want.loss_sum, bound(want.loss_sum));
    EXPECT_NEAR(got.entropy_sum, want.entropy_sum, 1e-5 * want.entropy_sum);
    EXPECT_NEAR(got.ratio_sum, want.ratio_sum, 1e-5 * want.ratio_sum);
    EXPECT_NEAR(got.approx_kl_sum, want.approx_kl_sum, 1e-5 * n);
    EXPECT_NEAR(got.ref_kl_sum, want.ref_kl_sum, bound(want.ref_kl_sum));
    std::printf("  loss %.9g (cpu %.9g), clipped %.0f (cpu %.0f) of %.0f\n", got.loss_sum,
                want.loss_sum, got.clipped, want.clipped, n);
    const Tensor lp = ToHost(logp);
    for (int64_t i = 0; i < lp.numel(); ++i) {
      ASSERT_NEAR(lp.data<float>()[i], logp_ref.data<float>()[i], 1e-4) << i;
    }
    // A token whose clip branch flipped has an O(1) different gradient row; a couple of them in
    // 800 rows stay well inside the relative-RMS tolerances.
    ExpectClose(dx, dx_ref, kernels::gpu_test::TolFor(dt), "dx");
    ExpectClose(dw, dw_ref, dt == DType::kBF16 ? kBf16Tol : kernels::gpu_test::kF32Tol, "dw (f32)");
  }
}

// The forward-only pass, and a masked target outside the vocabulary (one flag read back).
TEST_P(FusedPolicyLossGpuTest, TokenLogprobsAndBadTarget) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  policy_check::Case c = policy_check::RandomCase(500, 32, 1001, 17, PolicyLossOptions());
  c.x = Round(c.x, dt);
  c.w = Round(c.w, dt);
  const kernels::LmHeadPolicyOptions o = policy_check::OpOptions(c, 128);
  const kernels::PolicyRows cpu = policy_check::Rows(c, Device::Cpu());
  Tensor want, want_h;
  ASSERT_TRUE(
      kernels::LmHeadTokenLogprobs(c.x, c.w, cpu.targets, cpu.mask, o, &want, &want_h).ok());
  kernels::PolicyRows gpu = policy_check::Rows(c, Device::Cuda(0));
  Tensor logp = Poisoned({500}, DType::kF32), ent = Poisoned({500}, DType::kF32);
  ASSERT_TRUE(kernels::LmHeadTokenLogprobs(ToGpu(c.x, dt), ToGpu(c.w, dt), gpu.targets, gpu.mask, o,
                                           &logp, &ent)
                  .ok());
  const Tensor lp = ToHost(logp), h = ToHost(ent);
  for (int64_t i = 0; i < 500; ++i) {
    ASSERT_NEAR(lp.data<float>()[i], want.data<float>()[i], 1e-4) << i;
    ASSERT_NEAR(h.data<float>()[i], want_h.data<float>()[i], 1e-4) << i;
  }
  Tensor bad = cpu.targets.Clone();
  bad.data<int32_t>()[8] = 1001;  // row 8 is in the mask (every fifth row from 2 is not)
  gpu.targets = ToGpu(bad);
  kernels::PolicyRowSums sums;
  const Status st = kernels::LmHeadPolicyLoss(ToGpu(c.x, dt), ToGpu(c.w, dt), gpu, o, &sums,
                                              nullptr, nullptr, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.ToString();
  EXPECT_NE(st.message().find("targets[8] = 1001"), std::string::npos) << st.message();
}

INSTANTIATE_TEST_SUITE_P(All, FusedPolicyLossGpuTest, ::testing::Values(DType::kBF16, DType::kF32));

// The GPU trainer against the host trainer. f32: cuBLAS tiles and the GPU kernels' own (fixed)
// summation orders in the embedding scatter and the KDA f32 kernels differ from the host by
// ~1e-6 relative per op
// (GpuModelTest's f32 bounds: 1e-4 loss, 1e-3 gradients), 10x the CPU twins' ~1e-7: the CPU-twin
// test's tolerances times 10. bf16: gradients err up to 5e-2 per parameter (GpuModelTest), and
// AdamW turns every gradient element into a step of about lr, so the weights after 8 steps of
// lr 1e-2 may differ by a few percent, and near-ties at the clip boundaries and between experts go
// either way for a few tokens. Measured on an H200 (session 15): f32 weights 2.25e-5, bf16 0.18
// on the zero-initialised pseudo-queries and 0.10 on A_log (the sign-sensitive ones, held to
// 0.5 in bf16: a step of the wrong sign everywhere would be 2, no step at all 1), every other
// bf16 parameter within 0.1.
TEST(RlGpuTrainerTest, F32GpuTrainerMatchesHostTrainer) {
  SKIP_WITHOUT_GPU();
  trainer_check::CompareTrainers(Device::Cuda(0), DType::kF32, 2,
                                 {1e-4, 2e-3, 1.5e-3, 1.5e-3, 2, 3});
}

TEST(RlGpuTrainerTest, Bf16GpuTrainerMatchesHostTrainer) {
  SKIP_WITHOUT_GPU();
  trainer_check::CompareTrainers(Device::Cuda(0), DType::kBF16, 2, {2e-2, 5e-2, 1e-1, 5e-1, 8, 12});
}

}  // namespace
}  // namespace orrery::rl
