// The Tensor-level causal attention (kernels/attention.h) on the CPU: what it adds over the
// CausalAttentionForward/Backward templates it runs (model_ops_test.cc checks those against a
// naive softmax) — the dtype dispatch, the allocation of undefined outputs and the argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/philox.h"
#include "kernels/attention.h"
#include "kernels/mla_attention.h"
#include "tests/unit/kernels/kda_test_util.h"

namespace orrery::kernels {
namespace {

using testing::RandomNormal;
using testing::RelRmsError;

TEST(CausalAttentionOpTest, RunsTheTemplatesInBothDtypes) {
  const std::vector<int64_t> offsets = {0, 1, 9, 9, 40};
  const Tensor cu = Tensor::FromVector<int64_t>({5}, offsets);
  const int64_t n = 40, h = 2, dqk = 12, dv = 5;
  PhiloxGenerator rng(7, 0);
  const Tensor q = RandomNormal({n, h, dqk}, DType::kF64, rng);
  const Tensor k = RandomNormal({n, h, dqk}, DType::kF64, rng);
  const Tensor v = RandomNormal({n, h, dv}, DType::kF64, rng);
  const Tensor d_o = RandomNormal({n, h, dv}, DType::kF64, rng);
  const double scale = 0.3;

  Tensor o, lse, dq, dk, dvt;
  ASSERT_TRUE(CausalAttention(q, k, v, cu, scale, &o, &lse).ok());
  ASSERT_TRUE(CausalAttentionGrad(q, k, v, o, lse, d_o, cu, scale, &dq, &dk, &dvt).ok());
  const AttentionShape s{n, h, dqk, dv};
  Tensor o_t = Tensor::Empty({n, h, dv}, DType::kF64), lse_t = Tensor::Empty({n, h}, DType::kF64);
  CausalAttentionForward<double>(s, offsets, scale, q.data<double>(), k.data<double>(),
                                 v.data<double>(), o_t.data<double>(), lse_t.data<double>());
  Tensor dq_t = Tensor::Empty({n, h, dqk}, DType::kF64), dk_t = dq_t.Clone(),
         dv_t = Tensor::Empty({n, h, dv}, DType::kF64);
  CausalAttentionBackward<double>(s, offsets, scale, q.data<double>(), k.data<double>(),
                                  v.data<double>(), o.data<double>(), lse.data<double>(),
                                  d_o.data<double>(), dq_t.data<double>(), dk_t.data<double>(),
                                  dv_t.data<double>());
  EXPECT_EQ(RelRmsError(o, o_t), 0.0);
  EXPECT_EQ(RelRmsError(lse, lse_t), 0.0);
  EXPECT_EQ(RelRmsError(dq, dq_t), 0.0);
  EXPECT_EQ(RelRmsError(dk, dk_t), 0.0);
  EXPECT_EQ(RelRmsError(dvt, dv_t), 0.0);

  // f32: the same computation in single precision (sums of <= 31 terms: ~1e-7 relative).
  const auto f32 = [](const Tensor& t) { return t.Cast(DType::kF32).value(); };
  Tensor o32, lse32, dq32, dk32, dv32;
  ASSERT_TRUE(CausalAttention(f32(q), f32(k), f32(v), cu, scale, &o32, &lse32).ok());
  EXPECT_EQ(lse32.dtype(), DType::kF32);
  ASSERT_TRUE(CausalAttentionGrad(f32(q), f32(k), f32(v), o32, lse32, f32(d_o), cu, scale, &dq32,
                                  &dk32, &dv32)
                  .ok());
  EXPECT_LE(RelRmsError(o32, o), 1e-5);
  EXPECT_LE(RelRmsError(dq32, dq), 1e-5);
  EXPECT_LE(RelRmsError(dk32, dk), 1e-5);
  EXPECT_LE(RelRmsError(dv32, dvt), 1e-5);
}

TEST(CausalAttentionOpTest, RejectsBadArguments) {
  const Tensor q = Tensor::Zeros({5, 1, 4}, DType::kF64), v = Tensor::Zeros({5, 1, 3}, DType::kF64);
  Tensor o, lse;
  for (const std::vector<int64_t>& bad :
       {std::vector<int64_t>{0, 3, 2, 5}, std::vector<int64_t>{0, 4}, std::vector<int64_t>{1, 5}}) {
    const Tensor cu = Tensor::FromVector<int64_t>({static_cast<int64_t>(bad.size())}, bad);
    const Status st = CausalAttention(q, q, v, cu, 1.0, &o, &lse);
    EXPECT_FALSE(st.ok());
    EXPECT_EQ(st.message(),
              "causal_attention: cu_seqlens must rise from 0 to the token count 5 without falling");
  }
  const Tensor cu = Tensor::FromVector<int64_t>({2}, std::vector<int64_t>{0, 5});
  Status st = CausalAttention(q, q, Tensor::Zeros({4, 1, 3}, DType::kF64), cu, 1.0, &o, &lse);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "causal_attention: v f64[4, 1, 3] on cpu, expected f64[5, 1, 3] on cpu");
  ASSERT_TRUE(CausalAttention(q, q, v, cu, 1.0, &o, &lse).ok());
  Tensor dq, dk, dv;
  st = CausalAttentionGrad(q, q, v, o, lse.Cast(DType::kF32).value(), o, cu, 1.0, &dq, &dk, &dv);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "causal_attention: lse f32[5, 1] on cpu, expected f64[5, 1] on cpu");
}

}  // namespace
}  // namespace orrery::kernels
