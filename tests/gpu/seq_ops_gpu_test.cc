// The GPU model's KDA short conv (kernels/short_conv.h), Block AttnRes mixing (kernels/attn_res.h)
// and gates / casts (kernels/gates.h) against their CPU twins on fresh random inputs; skipped
// without a GPU.
//
// As in ops_gpu_test.cc, each reference runs in f64 on the very values the GPU sees (inputs
// rounded to bf16 or f32 first), so an error measures the kernel's f32 arithmetic and its output
// rounding only, and outputs are poisoned with NaN before each call (an element the kernel failed
// to write fails the check). Accumulated outputs (dw, d_sources) start from random values, so a
// kernel that overwrote instead of adding fails too. Tolerances (relative RMS error
// ||gpu - ref|| / ||ref||):
//   bf16 outputs: 5e-3. Rounding to bf16 alone gives ~1.1e-3 (half an 8-bit mantissa ulp,
//                 uniform); the rest is room for the f32 arithmetic before it, while a wrong tap,
//                 a token seen across a document boundary or a missed source shows >= 1e-2.
//   f32 outputs:  2e-5. The kernels' f32 sums run over at most ~d = 1000 terms per element
//                 (sqrt(1000) * 6e-8 = 2e-6), the f32 parameter gradients over up to ~50k terms
//                 split into per-block partial sums (a sequential f32 sum would reach ~1e-5 at
//                 50k random-sign terms); expf and rsqrtf add ~1e-7. A bf16 or TF32 intermediate
//                 would show ~1e-3 and fail.
//   casts:        exact (round to nearest even both sides).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "core/device.h"
#include "core/half.h"
#include "core/philox.h"
#include "kernels/attn_res.h"
#include "kernels/gates.h"
#include "kernels/short_conv.h"
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

// One InvalidArgument line that contains `want`.
void ExpectInvalid(const Status& st, const std::string& want) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find(want), std::string::npos) << st.ToString();
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.ToString();
}

Tensor CuOf(const std::vector<int64_t>& cu) {
  return Tensor::FromVector<int64_t>({static_cast<int64_t>(cu.size())}, cu);
}

// ---- the KDA short conv + SiLU ----

class ShortConvGpuTest : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(ShortConvGpuTest, ForwardAndBackwardMatchCpuTwin) {
  SKIP_WITHOUT_GPU();
  const auto [dt, width] = GetParam();
  // N and C multiples of neither the backward's 8 x 32 tile nor the 256-thread blocks. Ragged
  // documents: single tokens, an empty one, ones shorter than W; then every token its own
  // document (the decode-like packing).
  std::vector<int64_t> every(38);
  for (int64_t i = 0; i < 38; ++i) every[i] = i;
  const std::vector<std::tuple<int64_t, std::vector<int64_t>>> cases = {
      {200, {0, 1, 2, 9, 9, 300, 301, 777, 1001}}, {33, every}};
  for (const auto& [c, cu] : cases) {
    const int64_t n = cu.back();
    SCOPED_TRACE("N = " + std::to_string(n) + ", C = " + std::to_string(c));
    PhiloxGenerator rng(600 + width * 7 + c, 0);
    const Tensor x = Round(RandomNormal({n, c}, DType::kF64, rng, 2.0), dt);
    const Tensor w = Round(
        RandomNormal({c, width}, DType::kF64, rng, 1.0 / std::sqrt(static_cast<double>(width))),
        dt);
    const Tensor dy = Round(RandomNormal({n, c}, DType::kF64, rng), dt);
    const Tensor dw0 = Round(RandomNormal({c, width}, DType::kF64, rng), DType::kF32);
    Tensor y_ref, dx_ref, dw_ref = dw0.Clone();
    ASSERT_TRUE(ShortConvSilu(x, w, CuOf(cu), &y_ref).ok());
    ASSERT_TRUE(ShortConvSiluGrad(x, w, CuOf(cu), dy, &dx_ref, &dw_ref).ok());

    const Tensor xg = ToGpu(x, dt), wg = ToGpu(w, dt);
    const Tensor cug = CuOf(cu).To(Device::Cuda(0)).value();
    Tensor y = Poisoned({n, c}, dt);
    Status st = ShortConvSilu(xg, wg, cug, &y);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectClose(y, y_ref, TolFor(dt), "y");
    Tensor dx = Poisoned({n, c}, dt), dw = ToGpu(dw0, DType::kF32);
    st = ShortConvSiluGrad(xg, wg, cug, ToGpu(dy, dt), &dx, &dw);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectClose(dx, dx_ref, TolFor(dt), "dx");
    ExpectClose(dw, dw_ref, kF32Tol, "dw (f32, accumulated)");
  }
}

// W = 1 (no history), 4 (the spec's), 16 (the largest the config and the kernel take).
INSTANTIATE_TEST_SUITE_P(All, ShortConvGpuTest,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kF32),
                                            // 2-4 compiled as constants, 1 and 16 generic
                                            ::testing::Values(int64_t{1}, int64_t{2}, int64_t{3},
                                                              int64_t{4}, int64_t{16})));

TEST(ShortConvGpuErrors, RejectBadInputs) {
  SKIP_WITHOUT_GPU();
  const Tensor x = Poisoned({5, 3}, DType::kF32), w = Poisoned({3, 4}, DType::kF32);
  const Tensor cu = CuOf({0, 2, 5}).To(Device::Cuda(0)).value();
  Tensor y;
  ExpectInvalid(ShortConvSilu(x, Poisoned({3, 4}, DType::kBF16), cu, &y),
                "short_conv: w bf16[3, 4] on cuda:0, expected f32[3, W] with 1 <= W <= 16");
  ExpectInvalid(ShortConvSilu(x, w, CuOf({0, 2, 5}), &y),
                "short_conv: cu_seqlens i64[3] on cpu, expected i64 [docs + 1] with docs >= 1 on "
                "cuda:0");
  ExpectInvalid(ShortConvSilu(x, w, CuOf({0, 2, 4}).To(Device::Cuda(0)).value(), &y),
                "short_conv: cu_seqlens must start at 0 and end at N = 5, got 0 .. 4");
  ExpectInvalid(ShortConvSilu(Poisoned({5, 3}, DType::kF64), w, cu, &y),
                "expected bf16 or f32 on cuda");
  Tensor dx, dw = Poisoned({3, 4}, DType::kBF16);
  ExpectInvalid(ShortConvSiluGrad(x, w, cu, x, &dx, &dw),
                "short_conv: dw bf16[3, 4] on cuda:0, expected f32[3, 4] on cuda:0");
}

// ---- Block AttnRes mixing ----

class AttnResGpuTest
    : public ::testing::TestWithParam<std::tuple<DType, std::tuple<int64_t, int64_t>>> {};

TEST_P(AttnResGpuTest, ForwardAndBackwardMatchCpuTwin) {
  SKIP_WITHOUT_GPU();
  const auto [dt, nd] = GetParam();
  const auto [n, d] = nd;
  const int64_t rows = 777;
  const double eps = 1e-6;
  PhiloxGenerator rng(700 + n + d, 0);
  // Sources 0.1, 1 and 10 in scale (what the RMS-normalised keys are for); a query of norm ~2 so
  // the softmax is neither uniform nor one-hot.
  std::vector<Tensor> src, src_g;
  for (int64_t i = 0; i < n; ++i) {
    src.push_back(Round(RandomNormal({rows, d}, DType::kF64, rng, std::pow(10.0, i % 3 - 1)), dt));
    src_g.push_back(ToGpu(src.back(), dt));
  }
  const Tensor w =
      Round(RandomNormal({d}, DType::kF64, rng, 2.0 / std::sqrt(static_cast<double>(d))), dt);
  const Tensor gamma = Round(testing::RandomUniform({d}, DType::kF64, rng, 0.5, 1.5), dt);
  const Tensor dh = Round(RandomNormal({rows, d}, DType::kF64, rng), dt);
  Tensor h_ref, p_ref;
  ASSERT_TRUE(AttnResMix(src, w, gamma, eps, &h_ref, &p_ref).ok());

  const Tensor wg = ToGpu(w, dt), gg = ToGpu(gamma, dt);
  Tensor h = Poisoned({rows, d}, dt), p = Poisoned({rows, n}, DType::kF32);
  Status st = AttnResMix(src_g, wg, gg, eps, &h, &p);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectClose(h, h_ref, TolFor(dt), "h");
  ExpectClose(p, p_ref, kF32Tol, "p (f32)");
  Tensor h2 = Poisoned({rows, d}, dt);
  st = AttnResMix(src_g, wg, gg, eps, &h2, nullptr);  // not training: p not written
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectClose(h2, h_ref, TolFor(dt), "h (p not saved)");

  // Every third source needs no gradient (skipped); the others accumulate onto random values.
  std::vector<Tensor> ds_ref(n), ds(n);
  for (int64_t i = 0; i < n; ++i) {
    if (i % 3 == 1) continue;
    ds_ref[i] = Round(RandomNormal({rows, d}, DType::kF64, rng), DType::kF32);
    ds[i] = ToGpu(ds_ref[i], DType::kF32);
  }
  const Tensor dw0 = Round(RandomNormal({d}, DType::kF64, rng), DType::kF32);
  const Tensor dg0 = Round(RandomNormal({d}, DType::kF64, rng), DType::kF32);
  Tensor dw_ref = dw0.Clone(), dg_ref = dg0.Clone();
  ASSERT_TRUE(AttnResMixGrad(src, w, gamma, eps, p_ref, dh, &ds_ref, &dw_ref, &dg_ref).ok());
  Tensor dw = ToGpu(dw0, DType::kF32), dg = ToGpu(dg0, DType::kF32);
  st = AttnResMixGrad(src_g, wg, gg, eps, p, ToGpu(dh, dt), &ds, &dw, &dg);
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (int64_t i = 0; i < n; ++i) {
    if (i % 3 == 1) {
      EXPECT_FALSE(ds[i].defined());
      continue;
    }
    ExpectClose(ds[i], ds_ref[i], kF32Tol, "d_sources[" + std::to_string(i) + "] (f32)");
  }
  ExpectClose(dw, dw_ref, kF32Tol, "dw (f32, accumulated)");
  ExpectClose(dg, dg_ref, kF32Tol, "dgamma (f32, accumulated)");
}

// n: one source, K3's nine, past a warp's 32 (65). d = 64 runs four row groups per block; d = 13000
// keeps each block's du slots in its row of the global scratch (past the shared-memory path).
INSTANTIATE_TEST_SUITE_P(All, AttnResGpuTest,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kF32),
                                            ::testing::Values(std::tuple<int64_t, int64_t>{1, 64},
                                                              std::tuple<int64_t, int64_t>{9, 1000},
                                                              std::tuple<int64_t, int64_t>{65, 200},
                                                              std::tuple<int64_t, int64_t>{
                                                                  2, 13000})));

TEST(AttnResGpuErrors, RejectBadInputs) {
  SKIP_WITHOUT_GPU();
  const Tensor v = Poisoned({4}, DType::kF32);
  std::vector<Tensor> many(129, Poisoned({2, 4}, DType::kF32));
  Tensor h, p;
  ExpectInvalid(AttnResMix(many, v, v, 1e-6, &h, &p), "attn_res: 129 sources, at most 128 on cuda");
  const std::vector<Tensor> one = {Poisoned({2, 4}, DType::kBF16)};
  ExpectInvalid(AttnResMix(one, Poisoned({4}, DType::kBF16), v, 1e-6, &h, &p),
                "attn_res: gamma f32[4] on cuda:0, expected bf16[4] on cuda:0");
  const Tensor vb = Poisoned({4}, DType::kBF16);
  std::vector<Tensor> ds = {Poisoned({2, 4}, DType::kBF16)};
  Tensor dw, dg;
  ExpectInvalid(
      AttnResMixGrad(one, vb, vb, 1e-6, Poisoned({2, 1}, DType::kF32), one[0], &ds, &dw, &dg),
      "attn_res: d_sources[0] bf16[2, 4] on cuda:0, expected f32[2, 4] on cuda:0");
  ExpectInvalid(
      AttnResMixGrad(one, vb, vb, 1e-6, Poisoned({2, 1}, DType::kBF16), one[0], &ds, &dw, &dg),
      "attn_res: p bf16[2, 1] on cuda:0, expected f32[2, 1] on cuda:0");
}

// ---- gates, AddInto, CastInto ----

constexpr int64_t kElems = 100003;  // not a multiple of the 256-thread blocks

class GatesGpuTest : public ::testing::TestWithParam<DType> {};

TEST_P(GatesGpuTest, SigmoidGateAndSigmoidMatchCpuTwin) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  PhiloxGenerator rng(800, 0);
  const Tensor x = Round(RandomNormal({kElems}, DType::kF64, rng, 2.0), dt);
  const Tensor z = Round(RandomNormal({kElems}, DType::kF64, rng, 6.0), dt);
  const Tensor dy = Round(RandomNormal({kElems}, DType::kF64, rng), dt);
  Tensor y_ref, dx_ref, dz_ref, s_ref;
  ASSERT_TRUE(SigmoidGate(x, z, &y_ref).ok());
  ASSERT_TRUE(SigmoidGateGrad(x, z, dy, &dx_ref, &dz_ref).ok());
  ASSERT_TRUE(Sigmoid(z, &s_ref).ok());

  const Tensor xg = ToGpu(x, dt), zg = ToGpu(z, dt);
  Tensor y = Poisoned({kElems}, dt), dx = Poisoned({kElems}, dt), dz = Poisoned({kElems}, dt);
  Status st = SigmoidGate(xg, zg, &y);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectClose(y, y_ref, TolFor(dt), "sigmoid gate y");
  st = SigmoidGateGrad(xg, zg, ToGpu(dy, dt), &dx, &dz);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectClose(dx, dx_ref, TolFor(dt), "sigmoid gate dx");
  ExpectClose(dz, dz_ref, TolFor(dt), "sigmoid gate dz");
  Tensor s = Poisoned({kElems}, dt), s32 = Poisoned({kElems}, DType::kF32);
  st = Sigmoid(zg, &s);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectClose(s, s_ref, TolFor(dt), "sigmoid (x's dtype)");
  st = Sigmoid(zg, &s32);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectClose(s32, s_ref, kF32Tol, "sigmoid (f32 scores)");
}

TEST_P(GatesGpuTest, AddIntoMatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  PhiloxGenerator rng(810, 0);
  const Tensor x = Round(RandomNormal({kElems}, DType::kF64, rng), dt);
  const float alpha = -0.75f;
  // Into y of x's dtype, then into an f32 y (a bf16 x's gradient accumulation).
  for (DType yt : {dt, DType::kF32}) {
    const Tensor y0 = Round(RandomNormal({kElems}, DType::kF64, rng), yt);
    Tensor ref = y0.Clone();
    ASSERT_TRUE(AddInto(x, alpha, &ref).ok());
    Tensor y = ToGpu(y0, yt);
    const Status st = AddInto(ToGpu(x, dt), alpha, &y);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectClose(y, ref, TolFor(yt),
                "add_into " + std::string(DTypeName(dt)) + " into " + std::string(DTypeName(yt)));
  }
}

INSTANTIATE_TEST_SUITE_P(All, GatesGpuTest, ::testing::Values(DType::kBF16, DType::kF32));

// The bias of the low-rank output gate: y += b per row (bf16 or f32), db (f32) += column sums of
// dy, on 1000 x 300 (neither a multiple of the kernel's 32-column, 8-row tiles) against the CPU
// twin in f64. The sums over 1000 rows in f32 err ~1e-6 relative; bf16 inputs are rounded before
// both sides see them, so only the output rounding of y (bf16: TolFor) differs.
TEST_P(GatesGpuTest, RowBiasAndItsGradientMatchCpuTwin) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  constexpr int64_t kRows = 1000, kCols = 300;
  PhiloxGenerator rng(820, 0);
  const Tensor y0 = Round(RandomNormal({kRows, kCols}, DType::kF64, rng), dt);
  const Tensor b = Round(RandomNormal({kCols}, DType::kF64, rng), dt);
  const Tensor dy = Round(RandomNormal({kRows, kCols}, DType::kF64, rng), dt);
  const Tensor db0 = Round(RandomNormal({kCols}, DType::kF64, rng), DType::kF32);
  Tensor y_ref = y0.Clone(), db_ref = db0.Clone();  // Round gives f64: the twin in f64
  ASSERT_TRUE(AddRowBias(b, &y_ref).ok());
  ASSERT_TRUE(RowBiasGrad(dy, &db_ref).ok());
  Tensor y = ToGpu(y0, dt), db = ToGpu(db0, DType::kF32);
  Status st = AddRowBias(ToGpu(b, dt), &y);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectClose(y, y_ref, TolFor(dt), "add_row_bias y");
  st = RowBiasGrad(ToGpu(dy, dt), &db);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectClose(db, db_ref, kF32Tol, "row_bias_grad db");
}

TEST(CastIntoGpuTest, AllPairsMatchCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  PhiloxGenerator rng(820, 0);
  Tensor x32 = RandomNormal({kElems}, DType::kF32, rng, 3.0);
  // Ties (round to even: down, up), the largest finite bf16, a value past it (to +Inf), a
  // subnormal.
  const std::vector<float> special = {1.00390625f, 1.01171875f, 3.3895314e38f, 3.4e38f, 1e-40f};
  for (size_t i = 0; i < special.size(); ++i) x32.data<float>()[i] = special[i];
  const Tensor x16 = x32.Cast(DType::kBF16).value();
  for (const Tensor& x : {x32, x16}) {
    for (DType yt : {DType::kF32, DType::kBF16}) {
      Tensor want = Tensor::Zeros({kElems}, yt);
      ASSERT_TRUE(CastInto(x, &want).ok());
      Tensor y = Poisoned({kElems}, yt);
      const Status st = CastInto(x.To(Device::Cuda(0)).value(), &y);
      ASSERT_TRUE(st.ok()) << st.ToString();
      const Tensor got = y.To(Device::Cpu()).value();
      EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), got.nbytes()), 0)
          << DTypeName(x.dtype()) << " to " << DTypeName(yt);
    }
  }
}

TEST(GatesGpuErrors, RejectBadInputs) {
  SKIP_WITHOUT_GPU();
  const Tensor x = Poisoned({2, 3}, DType::kF32);
  Tensor yb = Poisoned({2, 3}, DType::kBF16);
  ExpectInvalid(Sigmoid(x, &yb), "sigmoid: y bf16[2, 3] on cuda:0, expected f32 [2, 3] on cuda:0");
  ExpectInvalid(AddInto(x, 1.0f, &yb), "add_into: y bf16[2, 3] on cuda:0, expected f32 [2, 3]");
  Tensor y_cpu = Tensor::Zeros({2, 3}, DType::kF32);
  ExpectInvalid(CastInto(x, &y_cpu),
                "cast_into: y f32[2, 3] on cpu, expected f32 or bf16 [2, 3] "
                "on cuda:0");
  Tensor dx, dz;
  ExpectInvalid(SigmoidGateGrad(x, x, Poisoned({3, 2}, DType::kF32), &dx, &dz),
                "sigmoid_gate: dy f32[3, 2] on cuda:0, expected f32[2, 3] on cuda:0");
}

}  // namespace
}  // namespace orrery::kernels
