// Causal attention per document (kernels/attention.h) on the GPU against its CPU twin (the
// CausalAttentionForward/Backward templates, run in f64) on fresh random inputs; skipped without a
// GPU.
//
// Each reference runs in f64 on the very values the GPU sees: q, k, v, dO rounded to bf16 or f32
// first, and the backward of both sides is given the same o (the reference's, rounded to the
// GPU's dtype) and lse (the reference's; the GPU's f32 copy of it). An error then measures the
// kernels' f32 arithmetic and their output rounding only. Outputs are poisoned with NaN before
// each call, so an element a kernel failed to write fails the check.
// Tolerances (relative RMS error ||gpu - ref|| / ||ref||):
//   bf16 outputs (o, dq, dk, dv): 5e-3. Rounding to bf16 alone gives ~1.1e-3 (2^-9 / sqrt(3));
//     the f32 sums behind it add ~1e-6. 5e-3 still leaves room for a tensor-core kernel that rounds
//     P and dS to bf16 before their products (another ~1e-3 each, averaged over the keys), and
//     fails on a wrong mask, a missed key tile or a wrong document boundary (>= 1e-1 here).
//   f32 outputs and lse: 2e-5. Dot products of <= 256 terms and sums over <= 300 keys in f32:
//     sqrt(300) * 6e-8 ~ 1e-6; lse (|lse| < 12) read back in f32 moves each p by < 1e-6.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/philox.h"
#include "kernels/attention.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/kernels/kda_test_util.h"

namespace orrery::kernels {
namespace {

using gpu_test::ExpectClose;
using gpu_test::kBf16Tol;
using gpu_test::kF32Tol;
using gpu_test::Poisoned;
using gpu_test::Round;
using gpu_test::ToGpu;
using gpu_test::ToHostF64;
using gpu_test::TolFor;
using testing::RandomNormal;
using testing::RelRmsError;

// Document lengths: a single token, lengths below, at and past the 32-row tiles, an empty
// document, and tiles that straddle documents (the offsets are not multiples of 32).
const std::vector<int64_t> kDocLengths = {1, 7, 130, 0, 300, 45, 32};

Tensor Offsets(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> cu = {0};
  for (int64_t len : lengths) cu.push_back(cu.back() + len);
  return Tensor::FromVector<int64_t>({static_cast<int64_t>(cu.size())}, cu);
}

using Dims = std::pair<int64_t, int64_t>;                // qk_dim, v_dim
using AttentionCase = std::tuple<DType, Dims, int64_t>;  // dtype, dims, heads
class AttentionGpuTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionGpuTest, ForwardAndBackwardMatchCpuTwin) {
  SKIP_WITHOUT_GPU();
  const auto [dt, dims, heads] = GetParam();
  const auto [dqk, dv] = dims;
  const Tensor cu = Offsets(kDocLengths);
  const int64_t n = cu.data<int64_t>()[cu.numel() - 1];
  PhiloxGenerator rng(static_cast<uint64_t>(1000 + dqk * 7 + dv * 3 + heads), 0);
  // q at twice the unit spread: scores ~ N(0, 4), a softmax peaked enough that the running max
  // matters.
  const Tensor q = Round(RandomNormal({n, heads, dqk}, DType::kF64, rng, 2.0), dt);
  const Tensor k = Round(RandomNormal({n, heads, dqk}, DType::kF64, rng), dt);
  const Tensor v = Round(RandomNormal({n, heads, dv}, DType::kF64, rng), dt);
  const Tensor d_o = Round(RandomNormal({n, heads, dv}, DType::kF64, rng), dt);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dqk));

  Tensor o_ref, lse_ref;
  ASSERT_TRUE(CausalAttention(q, k, v, cu, scale, &o_ref, &lse_ref).ok());
  const Tensor qg = ToGpu(q, dt), kg = ToGpu(k, dt), vg = ToGpu(v, dt);
  const Tensor cug = cu.To(Device::Cuda(0)).value();
  Tensor o = Poisoned({n, heads, dv}, dt), lse = Poisoned({n, heads}, DType::kF32);
  Status st = CausalAttention(qg, kg, vg, cug, scale, &o, &lse);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectClose(o, o_ref, TolFor(dt), "o");
  ExpectClose(lse, lse_ref, kF32Tol, "lse (f32)");

  const Tensor o_in = Round(o_ref, dt);
  Tensor dq_ref, dk_ref, dv_ref;
  ASSERT_TRUE(
      CausalAttentionGrad(q, k, v, o_in, lse_ref, d_o, cu, scale, &dq_ref, &dk_ref, &dv_ref).ok());
  Tensor dq = Poisoned({n, heads, dqk}, dt), dk = Poisoned({n, heads, dqk}, dt),
         dvg = Poisoned({n, heads, dv}, dt);
  st = CausalAttentionGrad(qg, kg, vg, ToGpu(o_in, dt), ToGpu(lse_ref, DType::kF32), ToGpu(d_o, dt),
                           cug, scale, &dq, &dk, &dvg);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectClose(dq, dq_ref, TolFor(dt), "dq");
  ExpectClose(dk, dk_ref, TolFor(dt), "dk");
  ExpectClose(dvg, dv_ref, TolFor(dt), "dv");

  // The backward is deterministic: a second run gives the same bits.
  Tensor dq2, dk2, dv2;
  st = CausalAttentionGrad(qg, kg, vg, ToGpu(o_in, dt), ToGpu(lse_ref, DType::kF32), ToGpu(d_o, dt),
                           cug, scale, &dq2, &dk2, &dv2);
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (const auto& [a, b] :
       std::vector<std::pair<Tensor, Tensor>>{{dq, dq2}, {dk, dk2}, {dvg, dv2}}) {
    const Tensor ha = a.To(Device::Cpu()).value(), hb = b.To(Device::Cpu()).value();
    EXPECT_EQ(std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()), 0) << "not deterministic";
  }
}

// The model's full-size dims (192/128), a square 128/128, the largest (256/256), the tiny
// configs' 48/32 and 24/16, and odd dims (5/3) that fill no 16- or 32-wide fragment.
INSTANTIATE_TEST_SUITE_P(All, AttentionGpuTest,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kF32),
                                            ::testing::Values(Dims{192, 128}, Dims{128, 128},
                                                              Dims{256, 256}, Dims{48, 32},
                                                              Dims{24, 16}, Dims{5, 3}),
                                            ::testing::Values(int64_t{1}, int64_t{3})),
                         [](const auto& info) {
                           const Dims dims = std::get<1>(info.param);
                           return std::string(DTypeName(std::get<0>(info.param))) + "_qk" +
                                  std::to_string(dims.first) + "_v" + std::to_string(dims.second) +
                                  "_h" + std::to_string(std::get<2>(info.param));
                         });

TEST(AttentionGpuErrors, RejectsBadArguments) {
  SKIP_WITHOUT_GPU();
  const Tensor cug = Offsets({5}).To(Device::Cuda(0)).value();
  const Tensor q = Poisoned({5, 2, 257}, DType::kBF16), v = Poisoned({5, 2, 16}, DType::kBF16);
  Tensor o, lse;
  Status st = CausalAttention(q, q, v, cug, 1.0, &o, &lse);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "causal_attention: qk_dim 257, v_dim 16, expected <= 256 on cuda");

  const Tensor q64 = Poisoned({5, 2, 16}, DType::kBF16);
  st = CausalAttention(q64, q64, v, Offsets({5}), 1.0, &o, &lse);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("cu_seqlens i64[2] on cpu, expected i64[docs + 1] on cuda"),
            std::string::npos)
      << st.ToString();

  const Tensor v_f32 = Poisoned({5, 2, 16}, DType::kF32);
  st = CausalAttention(q64, q64, v_f32, cug, 1.0, &o, &lse);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("causal_attention: v f32[5, 2, 16]"), std::string::npos)
      << st.ToString();

  Tensor o_ok, lse_ok, dq, dk, dv;
  ASSERT_TRUE(CausalAttention(q64, q64, v, cug, 1.0, &o_ok, &lse_ok).ok());
  const Tensor lse_bf16 = Poisoned({5, 2}, DType::kBF16);
  st = CausalAttentionGrad(q64, q64, v, o_ok, lse_bf16, o_ok, cug, 1.0, &dq, &dk, &dv);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("causal_attention: lse bf16[5, 2]"), std::string::npos)
      << st.ToString();
}

}  // namespace
}  // namespace orrery::kernels
