// Prefix-causal attention (kernels/attention.h PrefixCausalAttention) on the GPU against its CPU
// twin run in f64 on the very values the GPU sees (q, k, v rounded to bf16 or f32 first), on fresh
// random inputs; skipped without a GPU. bf16 with head dims 192/128 and 128/128 runs a
// tensor-core forward with its PrefixRows row map (attention_forward_wgmma.cu on Hopper, the
// default, and attention_forward_tc.cu, forced), everything else the SIMT forward
// (attention_forward.cu); the tensor-core cases are also compared with the SIMT kernel
// (AttentionKernels::kSimt) on the same inputs, and with cu_q == cu_k both must give
// CausalAttention's results (the same kernel, tiles and masks).
// Tolerances (relative RMS, tests/gpu/gpu_test_util.h): bf16 outputs 5e-3 (the output's own
// rounding is ~1.65e-3, the tensor-core kernel also rounds P to bf16, ~1e-3 averaged over a
// tile's keys); f32 outputs and every lse 2e-5 (f32 sums over <= 16K keys: sqrt(16384) * 6e-8 ~
// 8e-6). A wrong key range, a missed tile or a wrong document gives >= 1e-1.
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
#include "kernels/cuda/attention_tc.h"
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
using gpu_test::ToHost;
using gpu_test::TolFor;
using testing::RandomNormal;

// (queries, keys) per document.
struct Layout {
  const char* name;
  std::vector<int64_t> queries, keys;
};

// Ragged: one query at the end of a long context (decode-like, n = 1), a document that is all
// queries (n = L: causal), an empty document, a document of keys without queries, lengths on no
// tile boundary, tiles straddling documents. Chunk: a 640-query chunk at the end of a 9000-key
// context (the engine's shape: many key tiles, the diagonal at an offset that is no multiple of
// 64) beside a second turn. Decode: single queries over contexts of 1, 65 and 3000 keys.
const std::vector<Layout> kLayouts = {
    {"ragged", {1, 70, 0, 3, 130, 0, 64}, {200, 70, 0, 9, 131, 5, 64}},
    {"chunk", {640, 37}, {9000, 1000}},
    {"decode", {1, 1, 1}, {1, 65, 3000}},
};

Tensor Offsets(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> cu = {0};
  for (int64_t len : lengths) cu.push_back(cu.back() + len);
  return Tensor::FromVector<int64_t>({static_cast<int64_t>(cu.size())}, cu);
}

using Dims = std::pair<int64_t, int64_t>;                     // qk_dim, v_dim
using PrefixCase = std::tuple<DType, Dims, int64_t, size_t>;  // dtype, dims, heads, layout
class PrefixAttentionGpuTest : public ::testing::TestWithParam<PrefixCase> {};

TEST_P(PrefixAttentionGpuTest, MatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  const auto [dt, dims, heads, li] = GetParam();
  const auto [dqk, dv] = dims;
  const Layout& layout = kLayouts[li];
  const Tensor cu_q = Offsets(layout.queries), cu_k = Offsets(layout.keys);
  const int64_t nq = cu_q.data<int64_t>()[cu_q.numel() - 1];
  const int64_t nk = cu_k.data<int64_t>()[cu_k.numel() - 1];
  PhiloxGenerator rng(static_cast<uint64_t>(300 + dqk * 7 + heads * 3 + li), 0);
  // q at twice the unit spread: scores ~ N(0, 4), a peaked softmax where the running max matters.
  const Tensor q = Round(RandomNormal({nq, heads, dqk}, DType::kF64, rng, 2.0), dt);
  const Tensor k = Round(RandomNormal({nk, heads, dqk}, DType::kF64, rng), dt);
  const Tensor v = Round(RandomNormal({nk, heads, dv}, DType::kF64, rng), dt);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dqk));
  Tensor o_ref, lse_ref;
  ASSERT_TRUE(PrefixCausalAttention(q, k, v, cu_q, cu_k, scale, &o_ref, &lse_ref).ok());

  const Tensor qg = ToGpu(q, dt), kg = ToGpu(k, dt), vg = ToGpu(v, dt);
  const Tensor cu_qg = ToGpu(cu_q), cu_kg = ToGpu(cu_k);
  Tensor o = Poisoned({nq, heads, dv}, dt), lse = Poisoned({nq, heads}, DType::kF32);
  Status st = PrefixCausalAttention(qg, kg, vg, cu_qg, cu_kg, scale, &o, &lse);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectClose(o, o_ref, TolFor(dt), std::string(layout.name) + " o");
  ExpectClose(lse, lse_ref, kF32Tol, std::string(layout.name) + " lse (f32)");

  if (cuda::AttentionTcSupported(qg, vg)) {
    Tensor o_s = Poisoned({nq, heads, dv}, dt), lse_s = Poisoned({nq, heads}, DType::kF32);
    st = cuda::PrefixCausalAttentionForwardCuda(qg, kg, vg, cu_qg, cu_kg, scale, &o_s, &lse_s,
                                                cuda::AttentionKernels::kSimt);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectClose(o, o_s, kBf16Tol, "tc o vs simt o");
    ExpectClose(lse, lse_s, kF32Tol, "tc lse vs simt lse");
    // The default is the Hopper set where it runs; the mma.sync set against the twin as well.
    Tensor o_m = Poisoned({nq, heads, dv}, dt), lse_m = Poisoned({nq, heads}, DType::kF32);
    st = cuda::PrefixCausalAttentionForwardCuda(qg, kg, vg, cu_qg, cu_kg, scale, &o_m, &lse_m,
                                                cuda::AttentionKernels::kMma);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectClose(o_m, o_ref, TolFor(dt), std::string(layout.name) + " mma o");
    ExpectClose(lse_m, lse_ref, kF32Tol, std::string(layout.name) + " mma lse (f32)");
  }
}

// The model's dims (192/128: the tensor-core kernel in bf16), 128/128, and the toy configs' 24/16
// (SIMT in both dtypes); 1, 3 and 8 heads.
std::vector<PrefixCase> Cases() {
  std::vector<PrefixCase> cases;
  for (size_t li = 0; li < kLayouts.size(); ++li) {
    for (const DType dt : {DType::kBF16, DType::kF32}) {
      for (const Dims& dims : {Dims{192, 128}, Dims{128, 128}, Dims{24, 16}}) {
        for (const int64_t heads : {int64_t{1}, int64_t{3}})
          cases.emplace_back(dt, dims, heads, li);
      }
    }
    cases.emplace_back(DType::kBF16, Dims{192, 128}, 8, li);
  }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(All, PrefixAttentionGpuTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) {
                           const Dims dims = std::get<1>(info.param);
                           return std::string(DTypeName(std::get<0>(info.param))) + "_qk" +
                                  std::to_string(dims.first) + "_v" + std::to_string(dims.second) +
                                  "_h" + std::to_string(std::get<2>(info.param)) + "_" +
                                  kLayouts[std::get<3>(info.param)].name;
                         });

// With cu_q == cu_k (the queries are the whole context) the prefix forward is the causal one: the
// same tiles, masks and order of sums, on both kernels. Expected bit for bit (printed); checked to
// 1e-6 relative (f32 lse, and o in f32) and 1e-4 (o in bf16): the two instantiations are compiled
// apart, and a different FMA contraction could move an f32 last bit and flip a bf16 rounding
// (2^-8 on one element of ~200K), while a wrong key range moves o by >= 1e-1.
TEST(PrefixAttentionGpuOpTest, EqualsCausalAttention) {
  SKIP_WITHOUT_GPU();
  const Tensor cu = ToGpu(Offsets({1, 63, 64, 65, 200, 1, 130, 17}));
  const int64_t n = 541, heads = 3;
  PhiloxGenerator rng(17, 0);
  for (const auto& [dt, dims] : {std::pair<DType, Dims>{DType::kBF16, Dims{192, 128}},
                                 std::pair<DType, Dims>{DType::kF32, Dims{24, 16}}}) {
    const Tensor q = ToGpu(RandomNormal({n, heads, dims.first}, DType::kF64, rng, 2.0), dt);
    const Tensor k = ToGpu(RandomNormal({n, heads, dims.first}, DType::kF64, rng), dt);
    const Tensor v = ToGpu(RandomNormal({n, heads, dims.second}, DType::kF64, rng), dt);
    Tensor o, lse, o_c, lse_c;
    ASSERT_TRUE(PrefixCausalAttention(q, k, v, cu, cu, 0.1, &o, &lse).ok());
    ASSERT_TRUE(CausalAttention(q, k, v, cu, 0.1, &o_c, &lse_c).ok());
    const std::string what = std::string(DTypeName(dt)) + " prefix vs causal";
    ExpectClose(o, o_c, dt == DType::kBF16 ? 1e-4 : 1e-6, what + " o");
    ExpectClose(lse, lse_c, 1e-6, what + " lse");
    for (const auto& [a, b] : std::vector<std::pair<Tensor, Tensor>>{{o, o_c}, {lse, lse_c}}) {
      const Tensor ha = ToHost(a), hb = ToHost(b);
      std::printf("  %s: %s\n", what.c_str(),
                  std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0 ? "the same bits"
                                                                              : "bits differ");
    }
  }
}

TEST(PrefixAttentionGpuOpTest, RejectsBadArguments) {
  SKIP_WITHOUT_GPU();
  const Tensor q = Poisoned({5, 2, 16}, DType::kBF16), k = Poisoned({9, 2, 16}, DType::kBF16);
  const Tensor v = Poisoned({9, 2, 16}, DType::kBF16);
  Tensor o, lse;
  Status st = PrefixCausalAttention(q, k, v, Offsets({5}), ToGpu(Offsets({9})), 1.0, &o, &lse);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.message(),
            "prefix_causal_attention: cu_q i64[2] on cpu, expected i64[docs + 1] on cuda:0");
  st = PrefixCausalAttention(q, k, Poisoned({9, 2, 16}, DType::kF32), ToGpu(Offsets({5})),
                             ToGpu(Offsets({9})), 1.0, &o, &lse);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.message(),
            "prefix_causal_attention: v f32[9, 2, 16] on cuda:0, expected bf16[9, 2, 16] on "
            "cuda:0");
}

}  // namespace
}  // namespace orrery::kernels
