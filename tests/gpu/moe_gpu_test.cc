// The MoE ops (kernels/moe.h, moe_balancing.h) on the GPU against their CPU twin on fresh random
// inputs; skipped without a GPU.
//
// Routing: the CUDA kernels compare s + b in f64 as the twin does and repeat its f32 operations in
// its order, so ids must match exactly (ties included) and the weights and the router gradient to
// the last bit in practice; their bound, 1e-6 relative RMS, only allows for a differently rounded
// f32 division and still fails on any wrong id or term. The Quantile Balancing thresholds are
// exact f64 order statistics of the twin's f64 margins: compared bit for bit.
// Experts: the twin runs in f64 on the very values the GPU sees (inputs rounded to bf16 or f32
// first; the weights are f32 on both), so an error measures the GPU's intermediate roundings and
// f32 accumulation only. Outputs are poisoned with NaN first, so an unwritten element fails.
// Tolerances (relative RMS error ||gpu - ref|| / ||ref||):
//   f32:   1e-5. cuBLASLt in full f32 (no TF32) and f32 sums of at most a few hundred terms in
//          another order: ~sqrt(300) * 6e-8 = 1e-6; TF32 (10-bit mantissa) would show ~1e-3.
//   bf16:  y 1e-2, gradients 2e-2. Each bf16 rounding adds ~1.1e-3 (2^-9 / sqrt(3)); the forward
//          rounds a, u, h, o and y in sequence (~2.5e-3 in quadrature), the backward also doe,
//          dh, da and du (~3.5e-3). The bounds leave 3-5x for the SiTU derivatives' gain and stay
//          far below what a wrong row, a missed or doubled term gives (>= 0.3 with k <= 8).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "core/device.h"
#include "core/philox.h"
#include "kernels/moe.h"
#include "kernels/moe_balancing.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/kernels/kda_test_util.h"

namespace orrery::kernels {
namespace {

using gpu_test::ExpectClose;
using gpu_test::Poisoned;
using gpu_test::Round;
using gpu_test::ToGpu;
using gpu_test::ToHost;
using gpu_test::ToHostF64;
using testing::RandomNormal;
using testing::RelRmsError;

constexpr double kRouteTol = 1e-6;
constexpr double kF32Tol = 1e-5;
constexpr double kBf16ForwardTol = 1e-2;
constexpr double kBf16GradTol = 2e-2;

// Bytes equal: ids, rows, and values that must match the twin bit for bit.
void ExpectSameBytes(const Tensor& gpu, const Tensor& ref, const char* what) {
  const Tensor g = ToHost(gpu);
  ASSERT_EQ(g.nbytes(), ref.nbytes()) << what;
  EXPECT_EQ(std::memcmp(g.raw_data(), ref.raw_data(), g.nbytes()), 0) << what;
}

// Sigmoid scores [n, e] in f32; every third row on a grid of quarters (many exact ties of s + b
// against a bias on the same grid).
Tensor RandomScores(int64_t n, int64_t e, PhiloxGenerator& rng) {
  std::vector<float> s(static_cast<size_t>(n * e));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < e; ++i) {
      s[t * e + i] = t % 3 == 0 ? 0.25f * static_cast<float>(1 + rng.NextU32() % 3)
                                : static_cast<float>(1.0 / (1.0 + std::exp(-rng.Normal())));
    }
  }
  return Tensor::FromVector<float>({n, e}, s);
}

Tensor QuarterBias(int64_t e, PhiloxGenerator& rng) {
  std::vector<float> b(static_cast<size_t>(e));
  for (float& v : b) v = 0.25f * static_cast<float>(rng.NextU32() % 2);
  return Tensor::FromVector<float>({e}, b);
}

// Forced routing onto the first min(E, 2k) experts with expert 3 in every token's slot 0: one
// expert receives every token, the experts past the pool none.
Tensor ForcedIds(int64_t n, int64_t e, int64_t k, PhiloxGenerator& rng) {
  const int64_t pool = std::min(e, 2 * k);
  std::vector<int32_t> ids(static_cast<size_t>(n * k));
  for (int64_t t = 0; t < n; ++t) {
    ids[t * k] = 3;
    for (int64_t j = 1; j < k; ++j) {
      int32_t id;
      do {
        id = static_cast<int32_t>(rng.NextU32() % pool);
      } while (std::find(&ids[t * k], &ids[t * k + j], id) != &ids[t * k + j]);
      ids[t * k + j] = id;
    }
  }
  return Tensor::FromVector<int32_t>({n, k}, ids);
}

// ---- RouteTopK / RouteTopKGrad ----

using RouteCase = std::tuple<int64_t, int64_t, bool, bool>;  // E, k, bias, forced
class RouteTopKGpuTest : public ::testing::TestWithParam<RouteCase> {};

TEST_P(RouteTopKGpuTest, IdsWeightsAndGradientMatchCpuTwin) {
  SKIP_WITHOUT_GPU();
  const auto [e, k, with_bias, forced] = GetParam();
  const int64_t n = 1001;
  const double rho = 2.5;
  PhiloxGenerator rng(600 + e + k + 2 * with_bias + forced, 0);
  const Tensor scores = RandomScores(n, e, rng);
  const Tensor bias = with_bias ? QuarterBias(e, rng) : Tensor();
  const Tensor forced_ids = forced ? ForcedIds(n, e, k, rng) : Tensor();
  Tensor ids_ref, w_ref;
  ASSERT_TRUE(RouteTopK(scores, bias, forced_ids, k, rho, &ids_ref, &w_ref).ok());
  Tensor ids = Poisoned({n, k}, DType::kI32), w = Poisoned({n, k}, DType::kF32);
  Status st = RouteTopK(ToGpu(scores), with_bias ? ToGpu(bias) : Tensor(),
                        forced ? ToGpu(forced_ids) : Tensor(), k, rho, &ids, &w);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectSameBytes(ids, ids_ref, "ids");
  ExpectClose(w, w_ref, kRouteTol, "weights");

  const Tensor dweights = RandomNormal({n, k}, DType::kF32, rng);
  Tensor dl_ref, dl = Poisoned({n, e}, DType::kF32);
  ASSERT_TRUE(RouteTopKGrad(scores, ids_ref, dweights, rho, &dl_ref).ok());
  st = RouteTopKGrad(ToGpu(scores), ids, ToGpu(dweights), rho, &dl);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectClose(dl, dl_ref, kRouteTol, "dlogits");
}

// E = 1024, k = 16: the largest problem (the warp's 32-bit mask and the staged row are full).
INSTANTIATE_TEST_SUITE_P(
    All, RouteTopKGpuTest,
    ::testing::Values(RouteCase{8, 2, false, false}, RouteCase{8, 2, true, false},
                      RouteCase{64, 8, true, false}, RouteCase{64, 8, false, true},
                      RouteCase{1024, 16, true, false}, RouteCase{1000, 16, true, false},
                      RouteCase{8, 2, false, true}),
    [](const auto& info) {
      return "E" + std::to_string(std::get<0>(info.param)) + "_k" +
             std::to_string(std::get<1>(info.param)) + (std::get<2>(info.param) ? "_bias" : "") +
             (std::get<3>(info.param) ? "_forced" : "");
    });

// ---- MoeExperts / MoeExpertsGrad ----

// saved.offsets_device on the host, as int64.
std::vector<int64_t> DeviceOffsets(const MoeExpertsSaved& saved) {
  const Tensor h = ToHost(saved.offsets_device);
  return std::vector<int64_t>(h.data<int32_t>(), h.data<int32_t>() + h.numel());
}

enum class Routing { kTopK, kForced };
using ExpertsCase = std::tuple<DType, int64_t, int64_t, Routing>;  // dtype, E, k, routing
class MoeExpertsGpuTest : public ::testing::TestWithParam<ExpertsCase> {};

TEST_P(MoeExpertsGpuTest, ForwardAndBackwardMatchCpuTwin) {
  SKIP_WITHOUT_GPU();
  const auto [dt, e, k, routing] = GetParam();
  const int64_t n = 300, l = 96, f = 64;
  PhiloxGenerator rng(700 + e + k + static_cast<int>(routing) + (dt == DType::kBF16), 0);
  const GluActivation act;  // SiTU, beta 4, beta_lin 25
  // Routing as the model makes it (f32 weights on both devices).
  Tensor ids, weights;
  ASSERT_TRUE(RouteTopK(RandomScores(n, e, rng), Tensor(),
                        routing == Routing::kForced ? ForcedIds(n, e, k, rng) : Tensor(), k, 1.0,
                        &ids, &weights)
                  .ok());
  const Tensor xl = Round(RandomNormal({n, l}, DType::kF64, rng), dt);
  const Tensor w1 = Round(RandomNormal({e, f, l}, DType::kF64, rng, 1.0 / std::sqrt(l)), dt);
  const Tensor w3 = Round(RandomNormal({e, f, l}, DType::kF64, rng, 1.0 / std::sqrt(l)), dt);
  const Tensor w2 = Round(RandomNormal({e, l, f}, DType::kF64, rng, 1.0 / std::sqrt(f)), dt);
  const Tensor dy = Round(RandomNormal({n, l}, DType::kF64, rng), dt);
  // Accumulated outputs start from random values: the ops must add, not overwrite. Small ones, so
  // that the f32 rounding of start + gradient stays far below the f32 tolerance.
  const Tensor dxl0 = Round(RandomNormal({n, l}, DType::kF64, rng, 0.1), DType::kF32);
  const Tensor dw20 = Round(RandomNormal({e, l, f}, DType::kF64, rng, 0.1), DType::kF32);
  const Tensor w64 = weights.Cast(DType::kF64).value();

  Tensor y_ref, dweights_ref, dw1_ref, dw3_ref;
  Tensor dxl_ref = dxl0.Clone(), dw2_ref = dw20.Clone();
  MoeExpertsSaved saved_ref;
  ASSERT_TRUE(MoeExperts(xl, ids, w64, w1, w3, w2, act, &y_ref, &saved_ref).ok());
  ASSERT_TRUE(MoeExpertsGrad(xl, ids, w64, w1, w3, w2, act, saved_ref, dy, &dxl_ref, &dweights_ref,
                             &dw1_ref, &dw3_ref, &dw2_ref)
                  .ok());
  if (routing == Routing::kForced) {
    ASSERT_EQ(saved_ref.offsets[4] - saved_ref.offsets[3], n) << "expert 3 has every token";
    if (2 * k < e) {
      ASSERT_EQ(saved_ref.offsets[e] - saved_ref.offsets[2 * k], 0) << "experts >= 2k: none";
    }
  }

  const Tensor xg = ToGpu(xl, dt), idg = ToGpu(ids), wg = ToGpu(weights);
  const Tensor w1g = ToGpu(w1, dt), w3g = ToGpu(w3, dt), w2g = ToGpu(w2, dt);
  Tensor y = Poisoned({n, l}, dt);
  MoeExpertsSaved saved;
  Status st = MoeExperts(xg, idg, wg, w1g, w3g, w2g, act, &y, &saved);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(DeviceOffsets(saved), saved_ref.offsets);
  // The grouped path (bf16; l and f multiples of 8) keeps the offsets on the device only.
  EXPECT_EQ(saved.offsets.empty(), dt == DType::kBF16);
  ExpectSameBytes(saved.perm, saved_ref.perm, "perm (a stable sort: one answer)");
  ExpectSameBytes(saved.rank, saved_ref.rank, "rank");
  const bool bf16 = dt == DType::kBF16;
  ExpectClose(y, y_ref, bf16 ? kBf16ForwardTol : kF32Tol, "y");

  Tensor dxl = ToGpu(dxl0, DType::kF32), dw2 = ToGpu(dw20, DType::kF32);
  Tensor dweights = Poisoned({n, k}, DType::kF32), dw1, dw3;
  st = MoeExpertsGrad(xg, idg, wg, w1g, w3g, w2g, act, saved, ToGpu(dy, dt), &dxl, &dweights, &dw1,
                      &dw3, &dw2);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const double tol = bf16 ? kBf16GradTol : kF32Tol;
  // dxl and dw2 are compared without their starting values (which would hide the gradient).
  Tensor dxl_delta = ToHostF64(dxl), dw2_delta = ToHostF64(dw2);
  Tensor dxl_ref_delta = dxl_ref.Clone(), dw2_ref_delta = dw2_ref.Clone();
  for (auto [got, want, start] :
       {std::tuple<Tensor*, Tensor*, const Tensor*>{&dxl_delta, &dxl_ref_delta, &dxl0},
        {&dw2_delta, &dw2_ref_delta, &dw20}}) {
    for (int64_t i = 0; i < got->numel(); ++i) {
      got->data<double>()[i] -= start->data<double>()[i];
      want->data<double>()[i] -= start->data<double>()[i];
    }
  }
  ExpectClose(dxl_delta, dxl_ref_delta, tol, "dxl (accumulated)");
  ExpectClose(dweights, dweights_ref, tol, "dweights");
  ExpectClose(dw1, dw1_ref, tol, "dw1");
  ExpectClose(dw3, dw3_ref, tol, "dw3");
  ExpectClose(dw2_delta, dw2_ref_delta, tol, "dw2 (accumulated)");
  if (bf16) {  // dy in f32 (the bf16 values, exactly): the same gradients
    Tensor dxl32, dweights32 = Poisoned({n, k}, DType::kF32), dw1_32, dw3_32, dw2_32;
    st = MoeExpertsGrad(xg, idg, wg, w1g, w3g, w2g, act, saved, ToGpu(dy, DType::kF32), &dxl32,
                        &dweights32, &dw1_32, &dw3_32, &dw2_32);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectClose(dweights32, dweights_ref, tol, "dweights (f32 dy)");
    ExpectClose(dw1_32, dw1_ref, tol, "dw1 (f32 dy)");
  }
}

INSTANTIATE_TEST_SUITE_P(All, MoeExpertsGpuTest,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kF32),
                                            ::testing::Values(int64_t{8}, int64_t{64}),
                                            ::testing::Values(int64_t{2}, int64_t{8}),
                                            ::testing::Values(Routing::kTopK, Routing::kForced)),
                         [](const auto& info) {
                           return std::string(DTypeName(std::get<0>(info.param))) + "_E" +
                                  std::to_string(std::get<1>(info.param)) + "_k" +
                                  std::to_string(std::get<2>(info.param)) +
                                  (std::get<3>(info.param) == Routing::kForced ? "_forced" : "");
                         });

// The grouped GEMM path against the per-expert cuBLASLt loop on the same GPU inputs, at the
// model's kind of shape (ragged counts from real routing, an expert with every token, experts
// without any). Both sum bf16 products in f32 and round a, u, h, o (and doe, dh, da, du) to bf16;
// they differ only in the order of the f32 sums, which flips a bf16 rounding here and there
// (~1e-3 relative RMS after the chain of roundings). 5e-3 is the op tests' one-rounding bound and
// far below a wrong row or expert (>= 0.1 relative with k = 4).
TEST(MoeExpertsGpuGroupedTest, GroupedPathMatchesPerExpertLoop) {
  SKIP_WITHOUT_GPU();
  constexpr double kPathTol = 5e-3;
  const int64_t n = 3000, e = 32, k = 4, l = 256, f = 136;  // f: a partial 128-wide tile
  PhiloxGenerator rng(1700, 0);
  const GluActivation act;
  Tensor ids, weights;
  ASSERT_TRUE(RouteTopK(ToGpu(RandomScores(n, e, rng)), Tensor(), ToGpu(ForcedIds(n, e, k, rng)), k,
                        1.0, &ids, &weights)
                  .ok());
  const DType dt = DType::kBF16;
  const Tensor xl = ToGpu(RandomNormal({n, l}, DType::kF64, rng), dt);
  const Tensor w1 = ToGpu(RandomNormal({e, f, l}, DType::kF64, rng, 1.0 / std::sqrt(l)), dt);
  const Tensor w3 = ToGpu(RandomNormal({e, f, l}, DType::kF64, rng, 1.0 / std::sqrt(l)), dt);
  const Tensor w2 = ToGpu(RandomNormal({e, l, f}, DType::kF64, rng, 1.0 / std::sqrt(f)), dt);
  const Tensor dy = ToGpu(RandomNormal({n, l}, DType::kF64, rng), dt);
  struct Run {
    Tensor y, dxl, dweights, dw1, dw3, dw2;
    MoeExpertsSaved saved;
  };
  Run runs[2];
  for (const bool grouped : {false, true}) {
    Run& r = runs[grouped];
    const MoeExpertsOptions opts{grouped};
    Status st = MoeExperts(xl, ids, weights, w1, w3, w2, act, &r.y, &r.saved, opts);
    ASSERT_TRUE(st.ok()) << st.ToString();
    st = MoeExpertsGrad(xl, ids, weights, w1, w3, w2, act, r.saved, dy, &r.dxl, &r.dweights, &r.dw1,
                        &r.dw3, &r.dw2, opts);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  const Run& loop = runs[0];
  const Run& grouped = runs[1];
  EXPECT_TRUE(grouped.saved.offsets.empty()) << "the grouped path read the offsets back";
  EXPECT_EQ(DeviceOffsets(grouped.saved), loop.saved.offsets);
  ExpectSameBytes(grouped.saved.perm, ToHost(loop.saved.perm), "perm");
  ExpectSameBytes(grouped.saved.rank, ToHost(loop.saved.rank), "rank");
  ExpectClose(grouped.y, loop.y, kPathTol, "y (grouped vs loop)");
  ExpectClose(grouped.dxl, loop.dxl, kPathTol, "dxl (grouped vs loop)");
  ExpectClose(grouped.dweights, loop.dweights, kPathTol, "dweights (grouped vs loop)");
  ExpectClose(grouped.dw1, loop.dw1, kPathTol, "dw1 (grouped vs loop)");
  ExpectClose(grouped.dw3, loop.dw3, kPathTol, "dw3 (grouped vs loop)");
  ExpectClose(grouped.dw2, loop.dw2, kPathTol, "dw2 (grouped vs loop)");
  // The backward's loop path from a grouped forward (offsets read back from the device).
  Tensor dxl, dweights, dw1, dw3, dw2;
  const Status st = MoeExpertsGrad(xl, ids, weights, w1, w3, w2, act, grouped.saved, dy, &dxl,
                                   &dweights, &dw1, &dw3, &dw2, MoeExpertsOptions{false});
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectClose(dw1, loop.dw1, kPathTol, "dw1 (loop backward of a grouped forward)");
}

// ---- Quantile Balancing thresholds ----

// The margins are the twin's f64 values and the selection is exact: the thresholds must be equal
// bit for bit (ties included: RandomScores puts every third row on a grid of quarters).
TEST(QuantileThresholdsGpuTest, EqualCpuTwinExactly) {
  SKIP_WITHOUT_GPU();
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{333, 8, 2},
                                {4097, 64, 8},
                                {1000, 1024, 16},
                                {1, 8, 2}}) {
    for (const bool exclusive : {false, true}) {
      PhiloxGenerator rng(900 + m + n + k, 0);
      const Tensor scores = RandomScores(m, n, rng);
      const Tensor bias = RandomNormal({n}, DType::kF32, rng, 0.1);
      Tensor ref, c = Poisoned({n}, DType::kF64);
      ASSERT_TRUE(QuantileThresholds(scores, bias, k, exclusive, &ref).ok());
      const Status st = QuantileThresholds(ToGpu(scores), ToGpu(bias), k, exclusive, &c);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ExpectSameBytes(c, ref, exclusive ? "thresholds (exclusive)" : "thresholds (cut-off)");
    }
  }
}

// The distributed form's pieces: the margins are the twin's f64 values bit for bit, and one radix
// pass's counts equal the twin's for queries at every shift, with prefixes taken from real values
// (so they match many keys) and random ones (so they match few or none).
TEST(QuantileThresholdsGpuTest, MarginsAndKeyHistogramsEqualCpuTwin) {
  SKIP_WITHOUT_GPU();
  for (const auto& [m, n, k] :
       {std::tuple<int64_t, int64_t, int64_t>{4097, 64, 8}, {300, 1024, 16}, {0, 8, 2}}) {
    for (const bool exclusive : {false, true}) {
      PhiloxGenerator rng(950 + m + n + k, 0);
      const Tensor scores = RandomScores(m, n, rng);
      const Tensor bias = RandomNormal({n}, DType::kF32, rng, 0.1);
      Tensor ref, margins = Poisoned({n, m}, DType::kF64);
      ASSERT_TRUE(QuantileMargins(scores, bias, k, exclusive, &ref).ok());
      const Status st = QuantileMargins(ToGpu(scores), ToGpu(bias), k, exclusive, &margins);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ExpectSameBytes(margins, ref, "margins");
      std::vector<int32_t> cols;
      std::vector<int64_t> prefixes;
      for (int i = 0; i < 64; ++i) {
        const int64_t c = static_cast<int64_t>(rng.UniformInt(static_cast<uint64_t>(n)));
        cols.push_back(static_cast<int32_t>(c));
        prefixes.push_back(
            m > 0 && i % 2 == 0
                ? static_cast<int64_t>(OrderKey(
                      ref.data<double>()[c * m + rng.UniformInt(static_cast<uint64_t>(m))]))
                : static_cast<int64_t>(uint64_t{rng.NextU32()} << 32 | rng.NextU32()));
      }
      const Tensor c_host = Tensor::FromVector<int32_t>({64}, cols);
      const Tensor p_host = Tensor::FromVector<int64_t>({64}, prefixes);
      for (int shift = 56; shift >= 0; shift -= 8) {
        Tensor h_ref, h = Poisoned({64, 256}, DType::kI32);
        ASSERT_TRUE(MarginKeyHistogram(ref, c_host, p_host, shift, &h_ref).ok());
        const Status hs = MarginKeyHistogram(margins, ToGpu(c_host), ToGpu(p_host), shift, &h);
        ASSERT_TRUE(hs.ok()) << hs.ToString();
        ExpectSameBytes(h, h_ref, ("histogram at shift " + std::to_string(shift)).c_str());
      }
    }
  }
}

// ---- argument errors: one InvalidArgument line, the CPU twin's where the twin has one ----

TEST(MoeGpuErrors, BadCallsAreOneClearLine) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 3, e = 8, k = 2, l = 4, f = 3;
  PhiloxGenerator rng(800, 0);
  const Tensor scores = ToGpu(RandomScores(n, e, rng));
  auto forced = [&](std::vector<int32_t> v) {
    return ToGpu(Tensor::FromVector<int32_t>({n, k}, v));
  };
  auto expect = [](const Status& st, const std::string& message) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_EQ(st.message(), message);
    EXPECT_EQ(st.message().find('\n'), std::string::npos);
  };
  Tensor ids, weights;
  expect(RouteTopK(scores, Tensor(), forced({0, 1, 2, 9, 4, 5}), k, 1.0, &ids, &weights),
         "forced_experts: expert id 9 at token 1 is outside [0, 8)");
  expect(RouteTopK(scores, Tensor(), forced({0, 1, 2, 3, 4, 4}), k, 1.0, &ids, &weights),
         "forced_experts: expert 4 repeated at token 2");
  const Tensor xl = Poisoned({n, l}, DType::kBF16);
  const Tensor w1 = Poisoned({e, f, l}, DType::kBF16), w2 = Poisoned({e, l, f}, DType::kBF16);
  const Tensor w = ToGpu(RandomNormal({n, k}, DType::kF32, rng));
  Tensor y;
  expect(MoeExperts(xl, forced({0, 1, 8, 3, 4, 5}), w, w1, w1, w2, {}, &y, nullptr),
         "moe_experts: ids[1, 0] = 8, expected [0, 8)");
  const Status st = MoeExperts(xl, forced({0, 1, 2, 3, 4, 5}), Poisoned({n, k}, DType::kBF16), w1,
                               w1, w2, {}, &y, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_EQ(st.message().rfind("moe_experts: weights bf16[3, 2]", 0), 0u) << st.ToString();
}

}  // namespace
}  // namespace orrery::kernels
