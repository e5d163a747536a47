// Causal attention per document (kernels/attention.h) on the GPU against its CPU twin (the
// CausalAttentionForward/Backward templates, run in f64) on fresh random inputs; skipped without a
// GPU. The bf16 cases with head dims 192/128 and 128/128 run each tensor-core kernel set in turn
// (AttentionKernels::kWgmma, the Hopper forward, and kMma, the mma.sync kernels; ops_cuda.h), all
// other cases the SIMT kernels; AttentionTcGpuTest below covers the tensor-core kernels on longer
// ragged batches and against the SIMT kernels.
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
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/philox.h"
#include "kernels/attention.h"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/ops_cuda.h"
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
// document, tiles that straddle documents (the offsets are not multiples of 32), and 65 tokens
// (one past the mma.sync kernels' 64-row tiles). The tensor-core cases add a document of 1100
// tokens (more than 8 of the wgmma forward's 128-key tiles).
const std::vector<int64_t> kDocLengths = {1, 7, 130, 0, 300, 45, 32, 65};
constexpr int64_t kLongDocTc = 1100;

Tensor Offsets(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> cu = {0};
  for (int64_t len : lengths) cu.push_back(cu.back() + len);
  return Tensor::FromVector<int64_t>({static_cast<int64_t>(cu.size())}, cu);
}

using Dims = std::pair<int64_t, int64_t>;                // qk_dim, v_dim
using AttentionCase = std::tuple<DType, Dims, int64_t>;  // dtype, dims, heads
class AttentionGpuTest : public ::testing::TestWithParam<AttentionCase> {};

// The kernel sets a case runs: each tensor-core set where it takes the inputs, else the default.
std::vector<cuda::AttentionKernels> KernelSets(DType dt, int64_t dqk, int64_t dv) {
  if (dt == DType::kBF16 && dv == 128 && (dqk == 192 || dqk == 128)) {
    return {cuda::AttentionKernels::kWgmma, cuda::AttentionKernels::kMma};
  }
  return {cuda::AttentionKernels::kFastest};
}
const char* KernelsName(cuda::AttentionKernels kernels) {
  switch (kernels) {
    case cuda::AttentionKernels::kWgmma:
      return "wgmma";
    case cuda::AttentionKernels::kMma:
      return "mma";
    case cuda::AttentionKernels::kSimt:
      return "simt";
    default:
      return "fastest";
  }
}

TEST_P(AttentionGpuTest, ForwardAndBackwardMatchCpuTwin) {
  SKIP_WITHOUT_GPU();
  const auto [dt, dims, heads] = GetParam();
  const auto [dqk, dv] = dims;
  const std::vector<cuda::AttentionKernels> sets = KernelSets(dt, dqk, dv);
  std::vector<int64_t> lengths = kDocLengths;
  if (sets.size() > 1) lengths.push_back(kLongDocTc);
  const Tensor cu = Offsets(lengths);
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
  const Tensor o_in = Round(o_ref, dt);
  Tensor dq_ref, dk_ref, dv_ref;
  ASSERT_TRUE(
      CausalAttentionGrad(q, k, v, o_in, lse_ref, d_o, cu, scale, &dq_ref, &dk_ref, &dv_ref).ok());
  const Tensor qg = ToGpu(q, dt), kg = ToGpu(k, dt), vg = ToGpu(v, dt);
  const Tensor cug = cu.To(Device::Cuda(0)).value();
  if (sets.size() > 1) {
    ASSERT_TRUE(cuda::AttentionWgmmaSupported(qg, kg, vg, scale))
        << "the wgmma forward would not run";
  }

  for (const cuda::AttentionKernels kernels : sets) {
    SCOPED_TRACE(std::string("kernels ") + KernelsName(kernels));
    std::printf("  kernels %s\n", KernelsName(kernels));
    Tensor o = Poisoned({n, heads, dv}, dt), lse = Poisoned({n, heads}, DType::kF32);
    Status st = cuda::CausalAttentionForwardCuda(qg, kg, vg, cug, scale, &o, &lse, kernels);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectClose(o, o_ref, TolFor(dt), "o");
    ExpectClose(lse, lse_ref, kF32Tol, "lse (f32)");

    Tensor dq = Poisoned({n, heads, dqk}, dt), dk = Poisoned({n, heads, dqk}, dt),
           dvg = Poisoned({n, heads, dv}, dt);
    st = cuda::CausalAttentionBackwardCuda(qg, kg, vg, ToGpu(o_in, dt), ToGpu(lse_ref, DType::kF32),
                                           ToGpu(d_o, dt), cug, scale, &dq, &dk, &dvg, kernels);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectClose(dq, dq_ref, TolFor(dt), "dq");
    ExpectClose(dk, dk_ref, TolFor(dt), "dk");
    ExpectClose(dvg, dv_ref, TolFor(dt), "dv");

    // The backward is deterministic: a second run gives the same bits.
    Tensor dq2 = Poisoned({n, heads, dqk}, dt), dk2 = Poisoned({n, heads, dqk}, dt),
           dv2 = Poisoned({n, heads, dv}, dt);
    st = cuda::CausalAttentionBackwardCuda(qg, kg, vg, ToGpu(o_in, dt), ToGpu(lse_ref, DType::kF32),
                                           ToGpu(d_o, dt), cug, scale, &dq2, &dk2, &dv2, kernels);
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (const auto& [a, b] :
         std::vector<std::pair<Tensor, Tensor>>{{dq, dq2}, {dk, dk2}, {dvg, dv2}}) {
      const Tensor ha = a.To(Device::Cpu()).value(), hb = b.To(Device::Cpu()).value();
      EXPECT_EQ(std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()), 0) << "not deterministic";
    }
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

// The tensor-core kernel sets (kWgmma: attention_forward_wgmma.cu; kMma: attention_forward_tc.cu;
// both with attention_backward_tc.cu; bf16, head dims 192/128 and 128/128) in turn on longer,
// ragged packed batches, against the CPU twin (f64 on the same bf16 values, as above) and against
// the SIMT kernels (AttentionKernels::kSimt) on the same inputs.
// Tolerances (relative RMS):
//   o, dq, dk, dv against the twin: kBf16Tol = 5e-3. The output's own bf16 rounding is ~1.65e-3
//     on Gaussian data; the kernels also round P (forward, dV) and dS (dK, dQ) to bf16 before
//     their products, a relative 2^-9 per element that averages over the >= 64 keys of a tile
//     (~1e-3 at most for short rows). A wrong mask, tile or document start gives >= 1e-1.
//   lse against the twin: kF32Tol = 2e-5: scores accumulate in f32 on the tensor cores (bf16
//     products are exact), so lse is f32-grade as for the SIMT kernel.
//   tensor-core against SIMT: 5e-3 as well: both differ from the twin by independent bf16
//     output roundings (sqrt(2) * 1.65e-3 = 2.3e-3) plus the tensor-core kernels' P/dS roundings.
// On a failure the worst element is printed as (token, head, column) with both values.

// Document lengths for the tensor-core tiles (mma.sync: 64 query rows, 64 keys in the forward, 32
// in the backward; wgmma: 128 query rows, 128 keys): a 1-token document at the start and in the
// middle, lengths one below, at and one past a 64-row tile, tiles straddling up to six documents,
// and a tail that ends mid-tile.
const std::vector<int64_t> kRaggedLengths = {1, 63, 64, 65, 200, 1, 130, 17};
// One document spanning ~47 64-row tiles (~24 wgmma key tiles) next to a 1-token one and a
// shorter one (T = 3701).
const std::vector<int64_t> kLongLengths = {3000, 1, 700};

// Fails with the worst element when gpu [tokens, heads, cols] (or [tokens, heads]) is further
// than tol relative RMS from ref; every element must be written (finite).
void ExpectCloseAt(const Tensor& gpu, const Tensor& ref, double tol, const std::string& what) {
  const Tensor g = ToHostF64(gpu), r = ToHostF64(ref);
  const int64_t heads = g.dim(1), cols = g.ndim() == 3 ? g.dim(2) : 1;
  int64_t worst = 0, unwritten = -1;
  double worst_err = -1.0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double gi = g.data<double>()[i];
    if (!std::isfinite(gi) && unwritten < 0) unwritten = i;
    const double e = std::fabs(gi - r.data<double>()[i]);
    if (e > worst_err) {
      worst_err = e;
      worst = i;
    }
  }
  const auto where = [&](int64_t i) {
    return "(token " + std::to_string(i / (heads * cols)) + ", head " +
           std::to_string(i / cols % heads) + ", column " + std::to_string(i % cols) + ")";
  };
  ASSERT_LT(unwritten, 0) << what << ": element " << where(unwritten) << " not written (NaN)";
  const double err = RelRmsError(g, r);
  EXPECT_LE(err, tol) << what << ": worst element " << where(worst) << " gpu "
                      << g.data<double>()[worst] << " ref " << r.data<double>()[worst];
  std::printf("  %-34s rel RMS error %.3g (tolerance %.0e), max abs %.3g at %s\n", what.c_str(),
              err, tol, worst_err, where(worst).c_str());
}

using TcCase = std::tuple<Dims, int, int64_t>;  // dims, layout (0: ragged, 1: long), heads
class AttentionTcGpuTest : public ::testing::TestWithParam<TcCase> {};

TEST_P(AttentionTcGpuTest, MatchesCpuTwinAndSimtKernels) {
  SKIP_WITHOUT_GPU();
  const auto [dims, layout, heads] = GetParam();
  const auto [dqk, dv] = dims;
  const DType dt = DType::kBF16;
  const Tensor cu = Offsets(layout == 0 ? kRaggedLengths : kLongLengths);
  const int64_t n = cu.data<int64_t>()[cu.numel() - 1];
  PhiloxGenerator rng(static_cast<uint64_t>(5000 + dqk * 7 + layout * 3 + heads), 0);
  const Tensor q = Round(RandomNormal({n, heads, dqk}, DType::kF64, rng, 2.0), dt);
  const Tensor k = Round(RandomNormal({n, heads, dqk}, DType::kF64, rng), dt);
  const Tensor v = Round(RandomNormal({n, heads, dv}, DType::kF64, rng), dt);
  const Tensor d_o = Round(RandomNormal({n, heads, dv}, DType::kF64, rng), dt);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dqk));
  const Tensor qg = ToGpu(q, dt), kg = ToGpu(k, dt), vg = ToGpu(v, dt), dog = ToGpu(d_o, dt);
  const Tensor cug = cu.To(Device::Cuda(0)).value();
  ASSERT_TRUE(cuda::AttentionTcSupported(qg, vg)) << "not a tensor-core case";
  ASSERT_TRUE(cuda::AttentionWgmmaSupported(qg, kg, vg, scale))
      << "the wgmma forward would not run";

  // The references: the twin, and the SIMT kernels on the same inputs. The backward takes the
  // reference's o (rounded to bf16) and lse, as in the test above.
  Tensor o_ref, lse_ref;
  ASSERT_TRUE(CausalAttention(q, k, v, cu, scale, &o_ref, &lse_ref).ok());
  Tensor o_simt = Poisoned({n, heads, dv}, dt), lse_simt = Poisoned({n, heads}, DType::kF32);
  Status st = cuda::CausalAttentionForwardCuda(qg, kg, vg, cug, scale, &o_simt, &lse_simt,
                                               cuda::AttentionKernels::kSimt);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const Tensor o_in = Round(o_ref, dt);
  const Tensor o_ing = ToGpu(o_in, dt), lse_g = ToGpu(lse_ref, DType::kF32);
  Tensor dq_ref, dk_ref, dv_ref;
  ASSERT_TRUE(
      CausalAttentionGrad(q, k, v, o_in, lse_ref, d_o, cu, scale, &dq_ref, &dk_ref, &dv_ref).ok());
  Tensor dq_s = Poisoned({n, heads, dqk}, dt), dk_s = Poisoned({n, heads, dqk}, dt),
         dv_s = Poisoned({n, heads, dv}, dt);
  st = cuda::CausalAttentionBackwardCuda(qg, kg, vg, o_ing, lse_g, dog, cug, scale, &dq_s, &dk_s,
                                         &dv_s, cuda::AttentionKernels::kSimt);
  ASSERT_TRUE(st.ok()) << st.ToString();

  for (const cuda::AttentionKernels kernels :
       {cuda::AttentionKernels::kWgmma, cuda::AttentionKernels::kMma}) {
    const std::string name = KernelsName(kernels);
    SCOPED_TRACE("kernels " + name);
    Tensor o = Poisoned({n, heads, dv}, dt), lse = Poisoned({n, heads}, DType::kF32);
    st = cuda::CausalAttentionForwardCuda(qg, kg, vg, cug, scale, &o, &lse, kernels);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectCloseAt(o, o_ref, kBf16Tol, name + " o");
    ExpectCloseAt(lse, lse_ref, kF32Tol, name + " lse (f32)");
    ExpectCloseAt(o, o_simt, kBf16Tol, name + " o vs simt o");
    ExpectCloseAt(lse, lse_simt, kF32Tol, name + " lse vs simt lse");
    if (kernels == cuda::AttentionKernels::kWgmma) {
      // Without the consumers' ping-pong only the order of issue changes: the same bits.
      Tensor o_free = Poisoned({n, heads, dv}, dt), lse_free = Poisoned({n, heads}, DType::kF32);
      st = cuda::AttentionForwardWgmma(qg, kg, vg, cug, scale, &o_free, &lse_free,
                                       cuda::DeviceContext::Get(0).value()->stream(),
                                       /*ping_pong=*/false);
      ASSERT_TRUE(st.ok()) << st.ToString();
      for (const auto& [a, b] :
           std::vector<std::pair<Tensor, Tensor>>{{o, o_free}, {lse, lse_free}}) {
        const Tensor ha = a.To(Device::Cpu()).value(), hb = b.To(Device::Cpu()).value();
        EXPECT_EQ(std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()), 0)
            << "the wgmma forward without ping-pong differs";
      }
    }

    Tensor dq = Poisoned({n, heads, dqk}, dt), dk = Poisoned({n, heads, dqk}, dt),
           dvg = Poisoned({n, heads, dv}, dt);
    st = cuda::CausalAttentionBackwardCuda(qg, kg, vg, o_ing, lse_g, dog, cug, scale, &dq, &dk,
                                           &dvg, kernels);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectCloseAt(dq, dq_ref, kBf16Tol, name + " dq");
    ExpectCloseAt(dk, dk_ref, kBf16Tol, name + " dk");
    ExpectCloseAt(dvg, dv_ref, kBf16Tol, name + " dv");
    ExpectCloseAt(dq, dq_s, kBf16Tol, name + " dq vs simt dq");
    ExpectCloseAt(dk, dk_s, kBf16Tol, name + " dk vs simt dk");
    ExpectCloseAt(dvg, dv_s, kBf16Tol, name + " dv vs simt dv");

    // Deterministic: a second run gives the same bits.
    Tensor dq2 = Poisoned({n, heads, dqk}, dt), dk2 = Poisoned({n, heads, dqk}, dt),
           dv2 = Poisoned({n, heads, dv}, dt);
    st = cuda::CausalAttentionBackwardCuda(qg, kg, vg, o_ing, lse_g, dog, cug, scale, &dq2, &dk2,
                                           &dv2, kernels);
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (const auto& [a, b] :
         std::vector<std::pair<Tensor, Tensor>>{{dq, dq2}, {dk, dk2}, {dvg, dv2}}) {
      const Tensor ha = a.To(Device::Cpu()).value(), hb = b.To(Device::Cpu()).value();
      EXPECT_EQ(std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()), 0) << "not deterministic";
    }
  }
}

// Both head-dim pairs; 1, 5 and 16 heads on the ragged batch, 2 heads on the long one.
std::vector<TcCase> TcCases() {
  std::vector<TcCase> cases;
  for (const Dims& dims : {Dims{192, 128}, Dims{128, 128}}) {
    for (const int64_t heads : {1, 5, 16}) cases.emplace_back(dims, 0, heads);
    cases.emplace_back(dims, 1, 2);
  }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(All, AttentionTcGpuTest, ::testing::ValuesIn(TcCases()),
                         [](const auto& info) {
                           const Dims dims = std::get<0>(info.param);
                           return "qk" + std::to_string(dims.first) + "_v" +
                                  std::to_string(dims.second) +
                                  (std::get<1>(info.param) == 0 ? "_ragged_h" : "_long_h") +
                                  std::to_string(std::get<2>(info.param));
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

// ORRERY_ATTENTION picks the kernel set the op runs (the op's o has the bits of the forced set's),
// and a value it does not know is one clear error.
TEST(AttentionGpuErrors, KernelSetFromEnvironment) {
  SKIP_WITHOUT_GPU();
  const Tensor cu = Offsets({70, 130});
  PhiloxGenerator rng(17, 0);
  const Tensor q = ToGpu(RandomNormal({200, 2, 128}, DType::kF64, rng), DType::kBF16);
  const Tensor k = ToGpu(RandomNormal({200, 2, 128}, DType::kF64, rng), DType::kBF16);
  const Tensor v = ToGpu(RandomNormal({200, 2, 128}, DType::kF64, rng), DType::kBF16);
  const Tensor cug = cu.To(Device::Cuda(0)).value();
  for (const auto& [name, kernels] : std::vector<std::pair<std::string, cuda::AttentionKernels>>{
           {"wgmma", cuda::AttentionKernels::kWgmma},
           {"mma", cuda::AttentionKernels::kMma},
           {"simt", cuda::AttentionKernels::kSimt}}) {
    ASSERT_EQ(setenv("ORRERY_ATTENTION", name.c_str(), 1), 0);
    Tensor o, lse;
    Status st = CausalAttention(q, k, v, cug, 0.1, &o, &lse);
    ASSERT_TRUE(st.ok()) << name << ": " << st.ToString();
    Tensor o_direct = Poisoned({200, 2, 128}, DType::kBF16),
           lse_direct = Poisoned({200, 2}, DType::kF32);
    st = cuda::CausalAttentionForwardCuda(q, k, v, cug, 0.1, &o_direct, &lse_direct, kernels);
    ASSERT_TRUE(st.ok()) << st.ToString();
    const Tensor a = o.To(Device::Cpu()).value(), b = o_direct.To(Device::Cpu()).value();
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0)
        << "ORRERY_ATTENTION=" << name;
  }
  ASSERT_EQ(setenv("ORRERY_ATTENTION", "flash", 1), 0);
  Tensor o, lse;
  const Status st = CausalAttention(q, k, v, cug, 0.1, &o, &lse);
  unsetenv("ORRERY_ATTENTION");
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.message(),
            "causal_attention: ORRERY_ATTENTION=flash, expected wgmma, mma or simt (or unset)");
}

}  // namespace
}  // namespace orrery::kernels
