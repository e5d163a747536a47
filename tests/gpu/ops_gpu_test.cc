// The GPU model's Tensor-level ops (issue 22, part 1) against their CPU twins on fresh random
// inputs; skipped without a GPU.
//
// Each reference runs in f64 on the very values the GPU sees (inputs rounded to bf16 or f32
// first), so an error measures the kernel's arithmetic and its output rounding only. Outputs are
// poisoned with NaN before each call, so an element the kernel failed to write fails the check.
// Tolerances (relative RMS error ||gpu - ref|| / ||ref||):
//   bf16 outputs:  5e-3. Rounding to bf16 alone gives ~1.1e-3 (2^-9 / sqrt(3), a uniform error
//                  of half an 8-bit mantissa ulp); 5e-3 leaves room for f32 accumulation and the
//                  f32 (not f64) intermediate rounding before it, and still fails on any wrong
//                  index, a missed term or a TF32/bf16 accumulation (>= 1e-2 at these sizes).
//   f32 outputs:   2e-5. Sums of up to ~1000 f32 terms in another order: sqrt(1000) * 6e-8.
//                  A TF32 product (10-bit mantissa) would show ~1e-3 and fail.
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
#include "kernels/adamw_op.h"
#include "kernels/embedding.h"
#include "kernels/lm_head_loss.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/situ.h"
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

// ---- Matmul (cuBLASLt) ----

using MatmulCase = std::tuple<bool, bool, DType, DType>;  // trans_a, trans_b, in, out
class MatmulGpuTest : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(MatmulGpuTest, MatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  const auto [ta, tb, in_dt, out_dt] = GetParam();
  for (auto [m, n, k, seed] : {std::tuple<int64_t, int64_t, int64_t, uint64_t>{37, 53, 29, 1},
                               {256, 384, 512, 2},
                               {1000, 64, 1000, 3}}) {
    PhiloxGenerator rng(seed * 17 + ta * 2 + tb, 0);
    const Tensor a = Round(RandomNormal(ta ? Shape{k, m} : Shape{m, k}, DType::kF64, rng), in_dt);
    const Tensor b = Round(RandomNormal(tb ? Shape{n, k} : Shape{k, n}, DType::kF64, rng), in_dt);
    const Tensor c0 = Round(RandomNormal({m, n}, DType::kF64, rng), out_dt);
    // beta = 1 accumulates into c (the weight gradients' dW += dy^T x) when c is f32.
    const float beta = out_dt == DType::kF32 ? 1.0f : 0.0f;
    MatmulOptions o{ta, tb, 0.75f, beta};
    Tensor ref = c0.Clone();
    ASSERT_TRUE(Matmul(a, b, o, &ref).ok());
    Tensor c = beta != 0 ? ToGpu(c0, out_dt) : Poisoned({m, n}, out_dt);
    const Status st = Matmul(ToGpu(a, in_dt), ToGpu(b, in_dt), o, &c);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectClose(c, ref, TolFor(out_dt), "matmul");
  }
}

// Every transpose pair with each (input, output) dtype pair Matmul accepts; f32 inputs with a
// bf16 output are refused (MatmulGpuErrors).
std::vector<MatmulCase> AcceptedMatmulCases() {
  std::vector<MatmulCase> cases;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (auto [in, out] :
           {std::pair{DType::kBF16, DType::kBF16}, std::pair{DType::kBF16, DType::kF32},
            std::pair{DType::kF32, DType::kF32}}) {
        cases.emplace_back(ta, tb, in, out);
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, MatmulGpuTest, ::testing::ValuesIn(AcceptedMatmulCases()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "T" : "N") +
                                  (std::get<1>(info.param) ? "T" : "N") + "_" +
                                  std::string(DTypeName(std::get<2>(info.param))) + "_" +
                                  std::string(DTypeName(std::get<3>(info.param)));
                         });

// The strided-batched form on the absorbed MLA's shapes (`small`'s: 8 heads, q [n, H * 192] with
// the first 128 columns of each head, W_kvb [H * 256, 256] in row blocks, outputs at column blocks
// of [n, H * w]; both transposes of b), bf16 and f32, against the CPU twin in f64; the elements
// of c outside the blocks must keep their values.
TEST(MatmulGpuTest, StridedBatchedMatchesCpuTwinOnTheAbsorbedMlaShapes) {
  SKIP_WITHOUT_GPU();
  const int64_t heads = 8, dqk = 192, dn = 128, dv = 128, dc = 256, w = 320;
  for (DType dt : {DType::kBF16, DType::kF32}) {
    for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{64}}) {
      PhiloxGenerator rng(70 + n, dt == DType::kBF16);
      const Tensor q = Round(RandomNormal({n, heads * dqk}, DType::kF64, rng), dt);
      const Tensor wkvb = Round(RandomNormal({heads * (dn + dv), dc}, DType::kF64, rng, 0.06), dt);
      const Tensor c0 = Round(RandomNormal({n, heads * w}, DType::kF64, rng), dt);
      // Queries: c_h [n, dc] at columns h * w of [n, H * w] = q_h [n, dn] W_UK,h [dn, dc].
      Tensor ref = c0.Clone();
      const MatrixBatch a_ref{q, 0, n, dn, heads * dqk, dqk};
      const MatrixBatch b_ref{wkvb, 0, dn, dc, dc, (dn + dv) * dc};
      ASSERT_TRUE(
          MatmulStridedBatched(a_ref, b_ref, heads, {}, {ref, 0, n, dc, heads * w, w}).ok());
      const Tensor qg = ToGpu(q, dt), wg = ToGpu(wkvb, dt);
      Tensor cg = ToGpu(c0, dt);
      Status st = MatmulStridedBatched({qg, 0, n, dn, heads * dqk, dqk},
                                       {wg, 0, dn, dc, dc, (dn + dv) * dc}, heads, {},
                                       {cg, 0, n, dc, heads * w, w});
      ASSERT_TRUE(st.ok()) << st.ToString();
      ExpectClose(cg, ref, TolFor(dt), "absorbed queries, n = " + std::to_string(n));
      // Outputs: o_h [n, dv] at columns h * dv = ol_h [n, dc] W_UV,h^T (W_UV,h [dv, dc]).
      const Tensor ol = Round(RandomNormal({n, heads * dc}, DType::kF64, rng), dt);
      Tensor o_ref = Tensor::Zeros({n, heads * dv}, DType::kF64);
      MatmulOptions nt;
      nt.trans_b = true;
      ASSERT_TRUE(MatmulStridedBatched({ol, 0, n, dc, heads * dc, dc},
                                       {wkvb, dn * dc, dv, dc, dc, (dn + dv) * dc}, heads, nt,
                                       {o_ref, 0, n, dv, heads * dv, dv})
                      .ok());
      Tensor og = Poisoned({n, heads * dv}, dt);
      st = MatmulStridedBatched({ToGpu(ol, dt), 0, n, dc, heads * dc, dc},
                                {wg, dn * dc, dv, dc, dc, (dn + dv) * dc}, heads, nt,
                                {og, 0, n, dv, heads * dv, dv});
      ASSERT_TRUE(st.ok()) << st.ToString();
      ExpectClose(og, o_ref, TolFor(dt), "absorbed output, n = " + std::to_string(n));
    }
  }
}

TEST(MatmulGpuErrors, RejectsF32InputsWithBf16Output) {
  SKIP_WITHOUT_GPU();
  Tensor a = Poisoned({4, 4}, DType::kF32), b = Poisoned({4, 4}, DType::kF32);
  Tensor c = Poisoned({4, 4}, DType::kBF16);
  const Status st = Matmul(a, b, {}, &c);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("expected bf16 a, b"), std::string::npos) << st.ToString();
}

// ---- RMSNorm ----

class RmsNormGpuTest : public ::testing::TestWithParam<std::tuple<DType, int64_t, bool>> {};

TEST_P(RmsNormGpuTest, ForwardAndBackwardMatchCpuTwin) {
  SKIP_WITHOUT_GPU();
  const auto [dt, d, with_w] = GetParam();
  const int64_t rows = 777;
  PhiloxGenerator rng(100 + d + with_w, 0);
  const Tensor x = Round(RandomNormal({rows, d}, DType::kF64, rng, 2.0), dt);
  const Tensor w = with_w ? Round(RandomNormal({d}, DType::kF64, rng), dt) : Tensor();
  const Tensor dy = Round(RandomNormal({rows, d}, DType::kF64, rng), dt);
  const double eps = 1e-6;

  Tensor y_ref, rstd_ref, dx_ref, dw_ref;
  ASSERT_TRUE(RmsNorm(x, w, eps, &y_ref, &rstd_ref).ok());
  ASSERT_TRUE(RmsNormGrad(x, w, rstd_ref, dy, &dx_ref, &dw_ref).ok());

  const Tensor xg = ToGpu(x, dt), dyg = ToGpu(dy, dt);
  const Tensor wg = with_w ? ToGpu(w, dt) : Tensor();
  Tensor y = Poisoned({rows, d}, dt), rstd = Poisoned({rows}, DType::kF32);
  Status st = RmsNorm(xg, wg, eps, &y, &rstd);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectClose(y, y_ref, TolFor(dt), "y");
  ExpectClose(rstd, rstd_ref, kF32Tol, "rstd");

  Tensor dx = Poisoned({rows, d}, dt), dw;
  if (with_w) {
    dw = Tensor::Zeros({d}, DType::kF32).To(Device::Cuda(0)).value();
  }
  st = RmsNormGrad(xg, wg, rstd, dyg, &dx, with_w ? &dw : nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectClose(dx, dx_ref, TolFor(dt), "dx");
  if (with_w) ExpectClose(dw, dw_ref, kF32Tol, "dw (f32, summed over rows)");
}

// d = 13000 takes the dw path without shared memory (past kMaxSharedD).
INSTANTIATE_TEST_SUITE_P(All, RmsNormGpuTest,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kF32),
                                            ::testing::Values(int64_t{64}, int64_t{1000},
                                                              int64_t{13000}),
                                            ::testing::Bool()));

// ---- SiTU-GLU / SiLU-GLU ----

class GluGpuTest : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(GluGpuTest, ForwardAndBackwardMatchCpuTwin) {
  SKIP_WITHOUT_GPU();
  const auto [dt, situ] = GetParam();
  const int64_t n = 100003;
  GluActivation act;
  act.situ = situ;
  PhiloxGenerator rng(200 + situ, 0);
  // Spread wide enough that SiTU's caps (beta = 4, beta_lin = 25) bind on some elements.
  const Tensor a = Round(RandomNormal({n}, DType::kF64, rng, 6.0), dt);
  const Tensor u = Round(RandomNormal({n}, DType::kF64, rng, 30.0), dt);
  const Tensor dh = Round(RandomNormal({n}, DType::kF64, rng), dt);
  Tensor h_ref, da_ref, du_ref;
  ASSERT_TRUE(Glu(act, a, u, &h_ref).ok());
  ASSERT_TRUE(GluGrad(act, a, u, dh, &da_ref, &du_ref).ok());
  Tensor h = Poisoned({n}, dt), da = Poisoned({n}, dt), du = Poisoned({n}, dt);
  const Tensor ag = ToGpu(a, dt), ug = ToGpu(u, dt);
  Status st = Glu(act, ag, ug, &h);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectClose(h, h_ref, TolFor(dt), "h");
  st = GluGrad(act, ag, ug, ToGpu(dh, dt), &da, &du);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectClose(da, da_ref, TolFor(dt), "da");
  ExpectClose(du, du_ref, TolFor(dt), "du");
  if (situ) {  // the bound SiTU exists for: |h| < beta beta_lin in exact arithmetic; a
               // saturated tanh and sigmoid round to 1 (in f32, and h to bf16), so the stored
               // value may reach the bound but never pass it
    const Tensor hh = ToHostF64(h);
    for (int64_t i = 0; i < n; ++i) ASSERT_LE(std::abs(hh.data<double>()[i]), 4.0 * 25.0);
  }
}

INSTANTIATE_TEST_SUITE_P(All, GluGpuTest,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kF32),
                                            ::testing::Bool()));

// ---- the optimizer step: squared norm, clip factor, AdamW ----

TEST(AdamWGpuTest, ThreeClippedStepsMatchCpuTwin) {
  SKIP_WITHOUT_GPU();
  PhiloxGenerator rng(300, 0);
  const std::vector<Shape> shapes = {{1000, 37}, {5}, {129, 257}};
  std::vector<Tensor> p_cpu, m_cpu, v_cpu, p_gpu, m_gpu, v_gpu, bf16_gpu;
  for (const Shape& s : shapes) {
    p_cpu.push_back(RandomNormal(s, DType::kF32, rng, 0.02));
    m_cpu.push_back(Tensor::Zeros(s, DType::kF32));
    v_cpu.push_back(Tensor::Zeros(s, DType::kF32));
    p_gpu.push_back(p_cpu.back().To(Device::Cuda(0)).value());
    m_gpu.push_back(m_cpu.back().To(Device::Cuda(0)).value());
    v_gpu.push_back(v_cpu.back().To(Device::Cuda(0)).value());
    bf16_gpu.push_back(Poisoned(s, DType::kBF16));
  }
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<Tensor> g_cpu, g_gpu;
    for (const Shape& s : shapes) {
      g_cpu.push_back(RandomNormal(s, DType::kF32, rng, 0.5));
      g_gpu.push_back(g_cpu.back().To(Device::Cuda(0)).value());
    }
    Tensor ss_cpu, ss_gpu, f_cpu, f_gpu;
    ASSERT_TRUE(SquaredNorm(g_cpu, &ss_cpu).ok());
    Status st = SquaredNorm(g_gpu, &ss_gpu);
    ASSERT_TRUE(st.ok()) << st.ToString();
    // Block sums in f32 against an f64 running sum of positive terms: ~1e-7 relative.
    EXPECT_NEAR(ToHostF64(ss_gpu).data<double>()[0], ss_cpu.data<double>()[0],
                1e-6 * ss_cpu.data<double>()[0]);
    const double max_norm = 10.0;  // the gradients' norm is ~130: clipping acts
    ASSERT_TRUE(ClipFactor(ss_cpu, max_norm, &f_cpu).ok());
    ASSERT_TRUE(ClipFactor(ss_gpu, max_norm, &f_gpu).ok());
    ASSERT_LT(f_cpu.data<float>()[0], 1.0f);
    AdamWStepArgs args;
    args.lr = 1e-2;
    args.step = step;
    for (size_t i = 0; i < shapes.size(); ++i) {
      args.weight_decay = i == 1 ? 0.0 : 0.1;
      ASSERT_TRUE(AdamWStep(args, g_cpu[i], f_cpu, &p_cpu[i], &m_cpu[i], &v_cpu[i], nullptr).ok());
      st = AdamWStep(args, g_gpu[i], f_gpu, &p_gpu[i], &m_gpu[i], &v_gpu[i], &bf16_gpu[i]);
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    // The same f32 operations in the same order, except the factor and the norm's last bits
    // (the norm's f32 block sums): relative RMS ~1e-7.
    ExpectClose(p_gpu[i], Round(p_cpu[i], DType::kF32), 1e-6, "param");
    ExpectClose(m_gpu[i], Round(m_cpu[i], DType::kF32), 1e-6, "m");
    ExpectClose(v_gpu[i], Round(v_cpu[i], DType::kF32), 1e-6, "v");
    // The compute copy is exactly the master weights rounded to bf16.
    const Tensor want = ToHostF64(p_gpu[i]).Cast(DType::kBF16).value();
    const Tensor got = bf16_gpu[i].To(Device::Cpu()).value();
    ASSERT_EQ(std::memcmp(want.raw_data(), got.raw_data(), got.nbytes()), 0) << "bf16 copy";
  }
}

// The one-launch forms against the per-tensor ones on the same device: tensors smaller and larger
// than a chunk (65,536 elements) and one of exactly two chunks, mixed weight decay, bf16 copies.
// The same f32 operations in the same order per element: bit-equal.
TEST(AdamWGpuTest, StepManyAndZeroManyEqualThePerTensorOps) {
  SKIP_WITHOUT_GPU();
  PhiloxGenerator rng(310, 0);
  const std::vector<Shape> shapes = {{7}, {300, 700}, {2, 65536}, {65537}};
  std::vector<AdamWTensors> many;
  std::vector<Tensor> p1, m1, v1, b1, grads;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Tensor p = RandomNormal(shapes[i], DType::kF32, rng, 0.02).To(Device::Cuda(0)).value();
    const Tensor g = RandomNormal(shapes[i], DType::kF32, rng, 0.5).To(Device::Cuda(0)).value();
    const Tensor m = RandomNormal(shapes[i], DType::kF32, rng, 0.1).To(Device::Cuda(0)).value();
    Tensor vh = RandomNormal(shapes[i], DType::kF32, rng, 0.1);  // second moments are >= 0
    for (int64_t j = 0; j < vh.numel(); ++j) vh.data<float>()[j] = std::abs(vh.data<float>()[j]);
    const Tensor vpos = vh.To(Device::Cuda(0)).value();
    grads.push_back(g);
    p1.push_back(p.Clone());
    m1.push_back(m.Clone());
    v1.push_back(vpos.Clone());
    b1.push_back(Poisoned(shapes[i], DType::kBF16));
    many.push_back(
        {g, p.Clone(), m.Clone(), vpos.Clone(), Poisoned(shapes[i], DType::kBF16), i % 2 == 0});
  }
  Tensor factor = Tensor::FromVector<float>({1}, {0.75f}).To(Device::Cuda(0)).value();
  AdamWStepArgs args;
  args.lr = 3e-3;
  args.weight_decay = 0.1;
  args.step = 4;
  for (size_t i = 0; i < shapes.size(); ++i) {
    AdamWStepArgs a = args;
    if (i % 2 != 0) a.weight_decay = 0;
    ASSERT_TRUE(AdamWStep(a, grads[i], factor, &p1[i], &m1[i], &v1[i], &b1[i]).ok());
  }
  Status st = AdamWStepMany(args, factor, &many);
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto same = [](const Tensor& a, const Tensor& b, const std::string& what) {
    const Tensor ha = a.To(Device::Cpu()).value(), hb = b.To(Device::Cpu()).value();
    ASSERT_EQ(std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()), 0) << what;
  };
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::string at = " of tensor " + std::to_string(i);
    same(many[i].param, p1[i], "param" + at);
    same(many[i].m, m1[i], "m" + at);
    same(many[i].v, v1[i], "v" + at);
    same(many[i].param_bf16, b1[i], "bf16 copy" + at);
  }
  std::vector<Tensor> zero;
  for (const AdamWTensors& t : many) zero.push_back(t.m);
  st = ZeroMany(&zero);
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (const Tensor& z : zero) {
    const Tensor h = z.To(Device::Cpu()).value();
    for (int64_t j = 0; j < h.numel(); ++j) ASSERT_EQ(h.data<float>()[j], 0.0f) << j;
  }
  // The squared norm over tensors of several chunks each: f32 block sums, f64 across them.
  Tensor ss_gpu, ss_cpu;
  std::vector<Tensor> host;
  for (const Tensor& g : grads) host.push_back(g.To(Device::Cpu()).value());
  ASSERT_TRUE(SquaredNorm(grads, &ss_gpu).ok());
  ASSERT_TRUE(SquaredNorm(host, &ss_cpu).ok());
  EXPECT_NEAR(ToHostF64(ss_gpu).data<double>()[0], ss_cpu.data<double>()[0],
              1e-6 * ss_cpu.data<double>()[0]);
}

// ---- embedding gather / scatter-add ----

class EmbeddingGpuTest : public ::testing::TestWithParam<DType> {};

TEST_P(EmbeddingGpuTest, GatherAndScatterAddMatchCpuTwin) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t vocab = 1003, d = 200, n = 4099;
  PhiloxGenerator rng(400, 0);
  const Tensor table = Round(RandomNormal({vocab, d}, DType::kF64, rng), dt);
  std::vector<int32_t> id(n);
  for (int64_t i = 0; i < n; ++i) id[i] = static_cast<int32_t>(rng.NextU32() % 64);  // repeats
  id[5] = static_cast<int32_t>(vocab - 1);
  const Tensor ids = Tensor::FromVector<int32_t>({n}, id);
  const Tensor dy = Round(RandomNormal({n, d}, DType::kF64, rng), dt);
  Tensor y_ref, dt_ref = Tensor::Zeros({vocab, d}, DType::kF64);
  ASSERT_TRUE(EmbeddingGather(table, ids, &y_ref).ok());
  ASSERT_TRUE(EmbeddingScatterAdd(ids, dy, &dt_ref).ok());

  const Tensor ids_gpu = ids.To(Device::Cuda(0)).value();
  Tensor y = Poisoned({n, d}, dt);
  Status st = EmbeddingGather(ToGpu(table, dt), ids_gpu, &y);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectClose(y, y_ref, 0.0, "gather (a copy: exact)");
  Tensor dtable = Tensor::Zeros({vocab, d}, DType::kF32).To(Device::Cuda(0)).value();
  st = EmbeddingScatterAdd(ids_gpu, ToGpu(dy, dt), &dtable);
  ASSERT_TRUE(st.ok()) << st.ToString();
  // Each row sums ~64 f32 terms in sorted-run order: sqrt(64) * 6e-8.
  ExpectClose(dtable, dt_ref, kF32Tol, "scatter-add (f32)");

  std::vector<int32_t> bad = id;
  bad[77] = static_cast<int32_t>(vocab);
  const Tensor bad_gpu = Tensor::FromVector<int32_t>({n}, bad).To(Device::Cuda(0)).value();
  st = EmbeddingGather(ToGpu(table, dt), bad_gpu, &y);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "embedding: ids[77] = 1003, expected [0, 1003)");
}

INSTANTIATE_TEST_SUITE_P(All, EmbeddingGpuTest, ::testing::Values(DType::kBF16, DType::kF32));

// ---- the fused LM head + cross-entropy ----

class LmHeadLossGpuTest : public ::testing::TestWithParam<DType> {};

TEST_P(LmHeadLossGpuTest, LossAndGradientsMatchCpuTwin) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t n = 1000, d = 64, v = 5003;  // 4 chunks of 256, the last partial
  PhiloxGenerator rng(500, 0);
  const Tensor x = Round(RandomNormal({n, d}, DType::kF64, rng), dt);
  const Tensor w = Round(RandomNormal({v, d}, DType::kF64, rng, 0.3), dt);
  std::vector<int32_t> t(n);
  std::vector<float> m(n);
  for (int64_t i = 0; i < n; ++i) {
    t[i] = static_cast<int32_t>(rng.NextU32() % v);
    m[i] = i % 7 == 3 ? 0.0f : 1.0f;
  }
  const Tensor targets = Tensor::FromVector<int32_t>({n}, t);
  const Tensor mask = Tensor::FromVector<float>({n}, m);
  LmHeadLossOptions o;
  o.chunk_rows = 256;
  o.grad_scale = 1.0 / 857;
  double loss_ref = 0;
  Tensor dx_ref, dw_ref = Tensor::Zeros({v, d}, DType::kF64);
  ASSERT_TRUE(LmHeadCrossEntropy(x, w, targets, mask, o, &loss_ref, &dx_ref, &dw_ref).ok());

  double loss = 0;
  Tensor dx = Poisoned({n, d}, dt);
  Tensor dw = Tensor::Zeros({v, d}, DType::kF32).To(Device::Cuda(0)).value();
  const Status st =
      LmHeadCrossEntropy(ToGpu(x, dt), ToGpu(w, dt), targets.To(Device::Cuda(0)).value(),
                         mask.To(Device::Cuda(0)).value(), o, &loss, &dx, &dw);
  ASSERT_TRUE(st.ok()) << st.ToString();
  // The loss: f32 logits and softmax against f64, summed over 857 rows in f64: ~1e-6 relative.
  EXPECT_NEAR(loss, loss_ref, 1e-5 * loss_ref);
  std::printf("  loss %.9g (cpu f64 %.9g)\n", loss, loss_ref);
  // bf16: dz is rounded to bf16 before both products (~1.7e-3) and dx again on output (~1.7e-3):
  // ~2.4e-3 in quadrature, inside the bf16 tolerance.
  ExpectClose(dx, dx_ref, TolFor(dt), "dx");
  ExpectClose(dw, dw_ref, dt == DType::kBF16 ? kBf16Tol : kF32Tol, "dw (f32)");
}

INSTANTIATE_TEST_SUITE_P(All, LmHeadLossGpuTest, ::testing::Values(DType::kBF16, DType::kF32));

}  // namespace
}  // namespace orrery::kernels
