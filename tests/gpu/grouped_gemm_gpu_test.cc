// The grouped GEMMs (kernels/grouped_gemm.h) on the GPU against their CPU twin on fresh random
// inputs with ragged expert counts (empty experts, counts at the 128-row tile edges, or one expert
// with all rows); every case on both kernels, forced by ORRERY_GROUPED_GEMM: the test suites
// Mma/... (mma.sync, any device) and Wgmma256/..., Wgmma128/... (wgmma + TMA with C tiles of 256
// or 128 columns, skipped where the device is not compute capability 9.0). Skipped without a GPU.
//
// The twin runs in f64 on the very values the GPU sees (bf16-rounded inputs, exact in f64), so an
// error measures the kernel's f32 accumulation and its output rounding only. Tolerances (relative
// RMS error ||gpu - ref|| / ||ref||, checked per expert, so that one wrong expert is not diluted
// by the others):
//   f32 outputs: 1e-4. The bf16 x bf16 products are exact in f32; the f32 sums of up to K = 1024
//       (or, for the weight grad, a few thousand rows') terms err by ~sqrt(terms) * 2^-24 ~ 4e-6
//       in RMS, 2.4e-4 in the worst case of 4096 terms; the tensor cores' own adder rounding
//       is of the same order. A missing or extra row among R gives ~1/sqrt(R) >= 1.5e-2 (R up to
//       4500), a wrong element of a 128-row tile far more.
//   bf16 outputs: 5e-3 (the op tests' bound: one bf16 rounding, 1.1e-3 to 1.65e-3 RMS).
// The worst element of every expert is printed on failure as (expert, row, col), and must also
// lie within 10x the tolerance of the expert's reference RMS (bf16 rounds by at most 2^-9 of the
// value, below 1.2e-2 of the RMS for values under 6 RMS).
// Rows before offsets[0] and after offsets[E] hold NaN in every input: a read of them anywhere
// (the weight grad's masked rows included) turns a sum NaN. The outputs start NaN-poisoned (or
// random, when accumulated) and their rows outside the experts' must come back unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/philox.h"
#include "kernels/cuda/grouped_gemm_cuda.h"
#include "kernels/grouped_gemm.h"
#include "kernels/situ.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/kernels/kda_test_util.h"

namespace orrery::kernels {
namespace {

using gpu_test::Poisoned;
using gpu_test::Round;
using gpu_test::ToGpu;
using gpu_test::ToHost;
using gpu_test::ToHostF64;
using testing::RandomNormal;

constexpr double kF32Tol = 1e-4;
constexpr double kBf16Tol = 5e-3;
constexpr double kWorstFactor = 10;
constexpr int64_t kPad = 5;  // NaN rows before the first and after the last expert's rows

// Ragged counts for E experts: the edge counts 0, 1, 127, 128, 129 (tile boundaries), thousands
// and random small ones, in a seeded order; or (all_in_one) every row in one expert, the others
// empty.
std::vector<int64_t> RaggedCounts(int64_t e, int64_t big, bool all_in_one, PhiloxGenerator& rng) {
  const std::vector<int64_t> edges = {0, 1, 127, 128, 129, big};
  std::vector<int64_t> c(static_cast<size_t>(e));
  for (int64_t i = 0; i < e; ++i) {
    c[i] = all_in_one ? 0 : i < static_cast<int64_t>(edges.size()) ? edges[i] : rng.NextU32() % 300;
  }
  if (all_in_one) c[rng.NextU32() % e] = big;
  for (int64_t i = e - 1; i > 0; --i) std::swap(c[i], c[rng.NextU32() % (i + 1)]);
  if (e == 1) c[0] = big;
  return c;
}

// Sets ORRERY_GROUPED_GEMM for the life of the object (the kernel the ops choose at each call).
class ForceKernel {
 public:
  explicit ForceKernel(const char* kernel) {
    const char* old = std::getenv(kVar);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(kVar, kernel, 1);
  }
  ~ForceKernel() {
    if (had_) {
      setenv(kVar, old_.c_str(), 1);
    } else {
      unsetenv(kVar);
    }
  }
  ForceKernel(const ForceKernel&) = delete;
  ForceKernel& operator=(const ForceKernel&) = delete;

 private:
  static constexpr const char* kVar = "ORRERY_GROUPED_GEMM";
  bool had_ = false;
  std::string old_;
};

struct Problem {
  std::vector<int64_t> offsets;  // [E + 1], offsets[0] = kPad
  int64_t m = 0;                 // rows, kPad more after offsets[E]
  Tensor offsets_cpu, offsets_gpu;
};

Problem MakeProblem(const std::vector<int64_t>& counts, bool i64) {
  Problem p;
  p.offsets.push_back(kPad);
  for (int64_t c : counts) p.offsets.push_back(p.offsets.back() + c);
  p.m = p.offsets.back() + kPad;
  if (i64) {
    p.offsets_cpu =
        Tensor::FromVector<int64_t>({static_cast<int64_t>(p.offsets.size())}, p.offsets);
  } else {
    std::vector<int32_t> o(p.offsets.begin(), p.offsets.end());
    p.offsets_cpu = Tensor::FromVector<int32_t>({static_cast<int64_t>(o.size())}, o);
  }
  p.offsets_gpu = ToGpu(p.offsets_cpu);
  return p;
}

// Random [m, cols] rows rounded to bf16 (as f64), NaN outside the experts' rows.
Tensor RowsInput(const Problem& p, int64_t cols, PhiloxGenerator& rng) {
  Tensor t = Round(RandomNormal({p.m, cols}, DType::kF64, rng), DType::kBF16);
  double* d = t.data<double>();
  for (int64_t r = 0; r < p.m; ++r) {
    if (r >= p.offsets.front() && r < p.offsets.back()) continue;
    for (int64_t c = 0; c < cols; ++c) d[r * cols + c] = std::numeric_limits<double>::quiet_NaN();
  }
  return t;
}

// Compares rows [lo_e, hi_e) of got against ref per expert (relative RMS and worst element);
// rows outside every expert's must equal `untouched` bit for bit (after the f64 cast; NaN == NaN).
// stacked: got and ref are [E, R, C], one matrix per expert (then untouched is not used).
void ExpectExpertsClose(const Tensor& got_dev, const Tensor& ref, const Tensor& untouched,
                        const Problem& p, bool stacked, double tol, const std::string& what) {
  const Tensor g = ToHostF64(got_dev);
  const Tensor u = ToHostF64(untouched);
  const int64_t e = static_cast<int64_t>(p.offsets.size()) - 1;
  const int64_t cols = g.dim(g.ndim() - 1);
  const double* gd = g.data<double>();
  const double* rd = ref.data<double>();
  const double* ud = u.data<double>();
  double worst_err = 0;
  for (int64_t x = 0; x < e; ++x) {
    const int64_t lo = stacked ? x * g.dim(1) : p.offsets[x];
    const int64_t hi = stacked ? (x + 1) * g.dim(1) : p.offsets[x + 1];
    double num = 0, den = 0, worst = -1;
    int64_t wr = 0, wc = 0;
    bool finite = true;
    for (int64_t r = lo; r < hi; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const double a = gd[r * cols + c], b = rd[r * cols + c];
        if (!std::isfinite(a)) finite = false;
        num += (a - b) * (a - b);
        den += b * b;
        if (!(std::abs(a - b) <= worst)) {
          worst = std::abs(a - b);
          wr = r - lo;
          wc = c;
        }
      }
    }
    if (hi == lo) continue;
    const double err = std::sqrt(num / std::max(den, 1e-300));
    const double rms = std::sqrt(den / static_cast<double>((hi - lo) * cols));
    worst_err = std::max(worst_err, err);
    const std::string where = what + ": expert " + std::to_string(x) + " (" +
                              std::to_string(hi - lo) + (stacked ? " rows of W" : " rows") +
                              "), worst element at (expert " + std::to_string(x) + ", row " +
                              std::to_string(wr) + ", col " + std::to_string(wc) + "): got " +
                              std::to_string(gd[(lo + wr) * cols + wc]) + ", want " +
                              std::to_string(rd[(lo + wr) * cols + wc]);
    EXPECT_TRUE(finite) << where << " (a NaN or unwritten element)";
    EXPECT_LE(err, tol) << where;
    EXPECT_LE(worst, kWorstFactor * tol * std::max(rms, 1e-30)) << where << ", rms " << rms;
  }
  if (!stacked) {
    for (int64_t r = 0; r < g.dim(0); ++r) {
      if (r >= p.offsets.front() && r < p.offsets.back()) continue;
      ASSERT_EQ(std::memcmp(gd + r * cols, ud + r * cols, cols * sizeof(double)), 0)
          << what << ": row " << r << " outside the experts' rows was written";
    }
  }
  std::printf("  %-40s worst expert rel RMS error %.3g (tolerance %.0e)\n", what.c_str(), worst_err,
              tol);
}

// E, N, K, i64 offsets, one expert with all rows.
using Case = std::tuple<int64_t, int64_t, int64_t, bool, bool>;
// The kernel (ORRERY_GROUPED_GEMM: mma, wgmma128 or wgmma256), the case.
using Param = std::tuple<std::string, Case>;
class GroupedGemmGpuTest : public ::testing::TestWithParam<Param> {};

// A case's inputs (host f64 and device bf16), the twin's results and the accumulation starts,
// made once and shared by the two kernels' tests (the f64 twin is the slow part).
struct CaseData {
  Problem p;
  Tensor x, dy, w, xg, dyg, wg;
  Tensor y_ref, dx_ref, dw_ref;
  Tensor dx_start[2];  // rounded to f32, bf16
  Tensor dw0;
};

const CaseData& DataOf(const Case& c) {
  static std::map<Case, std::unique_ptr<CaseData>> cache;
  std::unique_ptr<CaseData>& slot = cache[c];
  if (slot != nullptr) return *slot;
  const auto [e, n, k, i64, all_in_one] = c;
  slot = std::make_unique<CaseData>();
  CaseData& d = *slot;
  PhiloxGenerator rng(1000 + e + n + 3 * k + i64 + 7 * all_in_one, 0);
  // "Thousands" rows for one expert, fewer for the widest shapes (the f64 twin's time).
  const int64_t big = n * k >= 512 * 1024 ? 1500 : 4500;
  d.p = MakeProblem(RaggedCounts(e, big, all_in_one, rng), i64);
  d.x = RowsInput(d.p, k, rng);
  d.dy = RowsInput(d.p, n, rng);
  d.w = Round(RandomNormal({e, n, k}, DType::kF64, rng, 1.0 / std::sqrt(k)), DType::kBF16);
  d.xg = ToGpu(d.x, DType::kBF16);
  d.dyg = ToGpu(d.dy, DType::kBF16);
  d.wg = ToGpu(d.w, DType::kBF16);
  EXPECT_TRUE(GroupedGemmForward(d.x, d.w, d.p.offsets_cpu, &d.y_ref).ok());
  EXPECT_TRUE(GroupedGemmInputGrad(d.dy, d.w, d.p.offsets_cpu, false, &d.dx_ref).ok());
  d.dw_ref = Tensor::Empty({e, n, k}, DType::kF64);
  std::memset(d.dw_ref.raw_data(), 0, d.dw_ref.nbytes());
  EXPECT_TRUE(GroupedGemmWeightGrad(d.dy, d.x, d.p.offsets_cpu, &d.dw_ref).ok());
  d.dx_start[0] = Round(RandomNormal({d.p.m, k}, DType::kF64, rng), DType::kF32);
  d.dx_start[1] = Round(RandomNormal({d.p.m, k}, DType::kF64, rng), DType::kBF16);
  d.dw0 = Round(RandomNormal({e, n, k}, DType::kF64, rng), DType::kF32);
  return d;
}

TEST_P(GroupedGemmGpuTest, ThreeProductsMatchCpuTwin) {
  SKIP_WITHOUT_GPU();
  const std::string kernel = std::get<0>(GetParam());
  const auto [e, n, k, i64, all_in_one] = std::get<1>(GetParam());
  if (kernel != "mma" && !cuda::GroupedGemmWgmmaAvailable(0)) {
    GTEST_SKIP() << "the wgmma kernel needs a compute capability 9.0 device";
  }
  const ForceKernel force(kernel.c_str());
  const CaseData& d = DataOf(std::get<1>(GetParam()));
  const Problem& p = d.p;
  std::printf("%s: E %lld N %lld K %lld, %lld rows%s, %s offsets\n", kernel.c_str(),
              static_cast<long long>(e), static_cast<long long>(n), static_cast<long long>(k),
              static_cast<long long>(p.m), all_in_one ? " all in one expert" : "",
              i64 ? "i64" : "i32");
  const Tensor &xg = d.xg, &dyg = d.dyg, &wg = d.wg;
  const Tensor &y_ref = d.y_ref, &dx_ref = d.dx_ref, &dw_ref = d.dw_ref;

  // Forward, into f32 and bf16.
  for (const DType out : {DType::kF32, DType::kBF16}) {
    const Tensor poison = Poisoned({p.m, n}, out);
    Tensor y = poison.Clone();
    const Status st = GroupedGemmForward(xg, wg, p.offsets_gpu, &y);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectExpertsClose(y, y_ref, poison, p, false, out == DType::kF32 ? kF32Tol : kBf16Tol,
                       std::string("forward y ") + std::string(DTypeName(out)));
  }

  // Input grad: overwritten (f32, bf16) and accumulated (f32, bf16) onto random starts.
  for (const DType out : {DType::kF32, DType::kBF16}) {
    for (const bool acc : {false, true}) {
      const Tensor& start64 = d.dx_start[out == DType::kF32 ? 0 : 1];
      const Tensor start = acc ? ToGpu(start64, out) : Poisoned({p.m, k}, out);
      Tensor dx = start.Clone();
      const Status st = GroupedGemmInputGrad(dyg, wg, p.offsets_gpu, acc, &dx);
      ASSERT_TRUE(st.ok()) << st.ToString();
      Tensor want = dx_ref.Clone();
      if (acc) {  // compare the sums: the start is of the product's size, so it cannot hide it
        for (int64_t i = 0; i < want.numel(); ++i) {
          want.data<double>()[i] += start64.data<double>()[i];
        }
      }
      ExpectExpertsClose(dx, want, start, p, false, out == DType::kF32 ? kF32Tol : kBf16Tol,
                         std::string("input grad dx ") + std::string(DTypeName(out)) +
                             (acc ? " accumulated" : ""));
    }
  }

  // Weight grad: accumulated onto a random f32 start; the delta is compared.
  const Tensor& dw0 = d.dw0;
  Tensor dw = ToGpu(dw0, DType::kF32);
  const Status st = GroupedGemmWeightGrad(dyg, xg, p.offsets_gpu, &dw);
  ASSERT_TRUE(st.ok()) << st.ToString();
  Tensor delta = ToHostF64(dw);
  for (int64_t i = 0; i < delta.numel(); ++i) delta.data<double>()[i] -= dw0.data<double>()[i];
  ExpectExpertsClose(delta, dw_ref, delta, p, true, kF32Tol, "weight grad dW (accumulated)");
  // Experts without rows: dW_e exactly its start.
  for (int64_t x_e = 0; x_e < e; ++x_e) {
    if (p.offsets[x_e + 1] != p.offsets[x_e]) continue;
    for (int64_t i = x_e * n * k; i < (x_e + 1) * n * k; ++i) {
      ASSERT_EQ(delta.data<double>()[i], 0.0) << "dW of expert " << x_e << " (no rows) changed";
    }
  }
}

// Cases: ragged counts over shapes whose N and K are multiples of the tiles or only of 8 (72 x 136,
// 264 x 200: a last column tile of 8 columns, partial reduction stages), one expert with all rows.
const auto kCases = ::testing::Values(
    Case{1, 64, 64, false, false}, Case{8, 64, 512, true, false}, Case{8, 512, 64, false, false},
    Case{8, 1024, 1024, true, false}, Case{32, 512, 512, false, false},
    Case{64, 1024, 512, true, false}, Case{64, 512, 1024, false, false},
    Case{32, 72, 136, true, false}, Case{8, 264, 200, false, false}, Case{6, 256, 384, true, true},
    Case{40, 136, 264, false, true});

std::string CaseName(const ::testing::TestParamInfo<Param>& info) {
  const auto [e, n, k, i64, all_in_one] = std::get<1>(info.param);
  return "E" + std::to_string(e) + "_N" + std::to_string(n) + "_K" + std::to_string(k) +
         (i64 ? "_i64" : "_i32") + (all_in_one ? "_all_in_one" : "");
}

// The mma.sync kernel's suite first: a failing wgmma launch cannot hide its results.
INSTANTIATE_TEST_SUITE_P(Mma, GroupedGemmGpuTest,
                         ::testing::Combine(::testing::Values(std::string("mma")), kCases),
                         CaseName);
INSTANTIATE_TEST_SUITE_P(Wgmma256, GroupedGemmGpuTest,
                         ::testing::Combine(::testing::Values(std::string("wgmma256")), kCases),
                         CaseName);
INSTANTIATE_TEST_SUITE_P(Wgmma128, GroupedGemmGpuTest,
                         ::testing::Combine(::testing::Values(std::string("wgmma128")), kCases),
                         CaseName);

// The fused gate/up product (GroupedGemmGlu: SiTU-GLU or SiLU-GLU in the wgmma kernel's epilogue)
// against its CPU twin in f64 (the same tolerances as above: h is a smooth function of a and u,
// |dh/da|, |dh/du| = O(1) at these magnitudes, so their f32 errors carry over at their size) and
// against the unfused composition on the GPU (GroupedGemmForward into f32 a and u, then Glu in
// f32; the fused kernel computes the same f32 sums and the same formula, glu_value.cuh). h in
// f32 and bf16, with and without the pre-activations a, u, on both tile widths; ragged experts, F
// not a multiple of the 128-column tile. Skipped where the fused kernel does not run.
using GluCase = std::tuple<int64_t, int64_t, int64_t, bool>;  // E, F, K, SiTU (else SiLU)
class GroupedGemmGluGpuTest : public ::testing::TestWithParam<GluCase> {};

TEST_P(GroupedGemmGluGpuTest, FusedMatchesTwinAndComposition) {
  SKIP_WITHOUT_GPU();
  if (!GroupedGemmGluFused(Device::Cuda(0))) {
    GTEST_SKIP() << "the fused GLU needs the wgmma kernel (a compute capability 9.0 device)";
  }
  const auto [e, f, k, situ] = GetParam();
  PhiloxGenerator rng(2000 + e + f + 3 * k + situ, 0);
  const Problem p = MakeProblem(RaggedCounts(e, 1500, false, rng), false);
  std::printf("glu %s: E %lld F %lld K %lld, %lld rows\n", situ ? "situ" : "silu",
              static_cast<long long>(e), static_cast<long long>(f), static_cast<long long>(k),
              static_cast<long long>(p.m));
  // a, u ~ N(0, 4): the caps below bend them (tanh(a / 2), tanh(u / 3) far from linear).
  GluActivation act;
  act.situ = situ;
  act.beta = 2.0;
  act.beta_lin = 3.0;
  const Tensor x = RowsInput(p, k, rng);
  const Tensor w1 =
      Round(RandomNormal({e, f, k}, DType::kF64, rng, 2.0 / std::sqrt(k)), DType::kBF16);
  const Tensor w3 =
      Round(RandomNormal({e, f, k}, DType::kF64, rng, 2.0 / std::sqrt(k)), DType::kBF16);
  const Tensor xg = ToGpu(x, DType::kBF16), w1g = ToGpu(w1, DType::kBF16);
  const Tensor w3g = ToGpu(w3, DType::kBF16);
  Tensor h_ref, a_ref, u_ref;
  ASSERT_TRUE(GroupedGemmGlu(act, x, w1, w3, p.offsets_cpu, &h_ref, &a_ref, &u_ref).ok());

  // The unfused composition on the GPU, in f32.
  Tensor a32 = Poisoned({p.m, f}, DType::kF32), u32 = Poisoned({p.m, f}, DType::kF32), h32;
  ASSERT_TRUE(GroupedGemmForward(xg, w1g, p.offsets_gpu, &a32).ok());
  ASSERT_TRUE(GroupedGemmForward(xg, w3g, p.offsets_gpu, &u32).ok());
  ASSERT_TRUE(Glu(act, a32, u32, &h32).ok());
  const Tensor h_unfused = ToHostF64(h32);

  for (const char* kernel : {"wgmma256", "wgmma128"}) {
    const ForceKernel force(kernel);
    for (const DType out : {DType::kF32, DType::kBF16}) {
      for (const bool pre : {false, true}) {
        const Tensor poison = Poisoned({p.m, f}, out);
        Tensor h = poison.Clone(), a = poison.Clone(), u = poison.Clone();
        const Status st = GroupedGemmGlu(act, xg, w1g, w3g, p.offsets_gpu, &h, pre ? &a : nullptr,
                                         pre ? &u : nullptr);
        ASSERT_TRUE(st.ok()) << st.ToString();
        const double tol = out == DType::kF32 ? kF32Tol : kBf16Tol;
        const std::string what = std::string(kernel) + " glu h " + std::string(DTypeName(out)) +
                                 (pre ? " (with a, u)" : "");
        ExpectExpertsClose(h, h_ref, poison, p, false, tol, what);
        if (out == DType::kF32) {
          ExpectExpertsClose(h, h_unfused, poison, p, false, tol, what + " vs unfused");
        }
        if (pre) {
          ExpectExpertsClose(a, a_ref, poison, p, false, tol, what + ": a");
          ExpectExpertsClose(u, u_ref, poison, p, false, tol, what + ": u");
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Wgmma, GroupedGemmGluGpuTest,
                         ::testing::Values(GluCase{8, 512, 768, true}, GluCase{8, 392, 136, false},
                                           GluCase{40, 136, 264, true}),
                         [](const auto& info) {
                           return "E" + std::to_string(std::get<0>(info.param)) + "_F" +
                                  std::to_string(std::get<1>(info.param)) + "_K" +
                                  std::to_string(std::get<2>(info.param)) +
                                  (std::get<3>(info.param) ? "_situ" : "_silu");
                         });

// Bad calls: one InvalidArgument line each.
TEST(GroupedGemmGpuErrors, BadCallsAreOneClearLine) {
  SKIP_WITHOUT_GPU();
  auto expect = [](const Status& st, const std::string& prefix) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_EQ(st.message().rfind(prefix, 0), 0u) << st.ToString();
    EXPECT_EQ(st.message().find('\n'), std::string::npos);
  };
  const Tensor off = ToGpu(Tensor::FromVector<int32_t>({3}, {0, 2, 4}));
  const Tensor x = Poisoned({4, 64}, DType::kBF16), w = Poisoned({2, 60, 64}, DType::kBF16);
  Tensor y;
  expect(GroupedGemmForward(x, w, off, &y),
         "grouped_gemm_forward: W's [N, K] = [60, 64]: the cuda kernels need N and K positive "
         "multiples of 8");
  const Tensor w_ok = Poisoned({2, 64, 64}, DType::kBF16);
  expect(GroupedGemmForward(x, w_ok, ToGpu(Tensor::FromVector<int32_t>({2}, {0, 4})), &y),
         "grouped_gemm_forward: offsets i32[2]");
  expect(GroupedGemmForward(Poisoned({4, 64}, DType::kF32), w_ok, off, &y),
         "grouped_gemm_forward: x f32[4, 64]");
  Tensor dx;
  expect(GroupedGemmInputGrad(x, w_ok, off, true, &dx),
         "grouped_gemm_input_grad: dx is undefined but accumulate is set");
  Tensor dw = Poisoned({2, 64, 64}, DType::kBF16);
  expect(GroupedGemmWeightGrad(x, x, off, &dw), "grouped_gemm_weight_grad: dw bf16[2, 64, 64]");
  Tensor h, a;
  expect(GroupedGemmGlu(GluActivation(), x, w_ok, w_ok, off, &h, &a, nullptr),
         "grouped_gemm_glu: a and u: both or neither");
  expect(GroupedGemmGlu(GluActivation(), x, w_ok, w, off, &h),
         "grouped_gemm_glu: w3 bf16[2, 60, 64]");
  {
    const ForceKernel mma("mma");
    expect(GroupedGemmGlu(GluActivation(), x, w_ok, w_ok, off, &h),
           "grouped_gemm_glu: the fused kernel needs");
  }
  const ForceKernel bogus("fast");
  expect(GroupedGemmForward(x, w_ok, off, &y),
         "grouped_gemm_forward: ORRERY_GROUPED_GEMM 'fast', expected mma, wgmma, wgmma128, "
         "wgmma256 or auto");
}

}  // namespace
}  // namespace orrery::kernels
