// The wgmma grouped GEMM's data flow emulated on the host with the kernel's own index functions
// (kernels/cuda/grouped_gemm_wgmma_layout.h), against the CPU twin (kernels/grouped_gemm.h),
// without a GPU. For every tile of the schedule and every stage: the producer's TMA boxes
// (BoxCount, BoxAt, MapBox, MapIs3d; zero fill outside the tensor, the 128-byte swizzle) into a
// stage that starts NaN (what a box does not cover is stale), the weight grad's zeroing of rows
// past the expert (ChunkPastRows), each consumer warpgroup's four k16 steps read through its
// descriptors (MakeDescriptor, DescriptorStart/Lbo/Sbo, WgmmaElementOffset), and the epilogue's map
// of a thread's registers to C (PlaceTile, AccRow, AccCol) with its masks. Inputs are small
// integers (every sum exact in f64, so the linear products must match the twin exactly) with NaN in
// the rows outside every expert; outputs start at a sentinel that must survive outside the experts'
// rows. What this cannot check is the hardware's reading of the same descriptors and boxes: the
// canonical layouts and TMA's swizzle as the PTX ISA gives them (layout_test.cc has those
// definitions) — the GPU tests cover that.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/philox.h"
#include "core/tensor.h"
#include "kernels/cuda/grouped_gemm_wgmma_layout.h"
#include "kernels/grouped_gemm.h"
#include "kernels/situ.h"

namespace orrery::kernels::cuda::grouped_gemm_wgmma {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kSentinel = 12345.0;

// A tensor as TMA sees it: dims innermost first, zero outside.
struct Global {
  int64_t d0 = 0, d1 = 0, d2 = 1;
  const double* v = nullptr;
  double At(int64_t c0, int64_t c1, int64_t c2) const {
    if (c0 < 0 || c0 >= d0 || c1 < 0 || c1 >= d1 || c2 < 0 || c2 >= d2) return 0.0;
    return v[(c2 * d1 + c1) * d0 + c0];
  }
};

struct Problem {
  std::vector<int64_t> off;  // [E + 1]
  int64_t m = 0;
};

Tensor SmallInts(const Shape& shape, PhiloxGenerator& rng) {
  Tensor t = Tensor::Empty(shape, DType::kF64);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<double>()[i] = static_cast<double>(static_cast<int>(rng.NextU32() % 7) - 3);
  }
  return t;
}

// Rows outside [off[0], off[E]) of a [m, cols] input become NaN.
void PoisonOutside(const Problem& p, Tensor* t) {
  const int64_t cols = t->dim(1);
  for (int64_t r = 0; r < p.m; ++r) {
    if (r >= p.off.front() && r < p.off.back()) continue;
    for (int64_t c = 0; c < cols; ++c) t->data<double>()[r * cols + c] = kNaN;
  }
}

double GluValueHost(const GluActivation& act, double a, double u) {
  const double s = 1.0 / (1.0 + std::exp(-a));
  if (!act.situ) return a * s * u;
  const double up = act.beta_lin > 0 ? act.beta_lin * std::tanh(u / act.beta_lin) : u;
  return act.beta * std::tanh(a / act.beta) * s * up;
}

// Runs product p's kernel logic on the host. maps: the tensors of kMapA, kMapB, kMapB2. c: the
// output ([M, n_out], or [E, c_rows, n_out] for the weight grad; h for the GLU, with a, u).
struct Launch {
  Launch(Product prod, const GemmShape& shape, const Global& a, const Global& b, const Global& b2)
      : p(prod), s(shape), maps{a, b, b2} {}
  Product p;
  GemmShape s;
  Global maps[3];
  double* c = nullptr;
  double* glu_a = nullptr;
  double* glu_u = nullptr;
  bool add = false;
  GluActivation act;
};

void Emulate(const Problem& prob, const Launch& run) {
  const Product p = run.p;
  const GemmShape& s = run.s;
  const bool wgrad = p == Product::kWeightGrad;
  const int tile_n = s.tile_n, stage_bytes = StageBytes(tile_n);
  std::vector<double> smem(stage_bytes / 2);
  std::vector<double> acc(2 * 64 * tile_n);
  std::vector<double> ta(64 * kWgmmaK), tb(tile_n * kWgmmaK);
  for (int e = 0; e < s.num_experts; ++e) {
    int64_t lo, hi;
    ClampRows(prob.off[e], prob.off[e + 1], s.m, &lo, &hi);
    const int64_t tiles = ExpertTiles(wgrad, hi - lo, s.tiles_m, s.tiles_n);
    for (int64_t local = 0; local < tiles; ++local) {
      const TilePlace pl =
          PlaceTile(wgrad, local, lo, hi, s.tiles_n, s.k_tiles, ColTile(p, tile_n));
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t kt = 0; kt < pl.k_tiles; ++kt) {
        // The producer's boxes.
        std::fill(smem.begin(), smem.end(), kNaN);
        std::vector<int> covered(stage_bytes / 2, 0);
        uint32_t bytes = 0;
        const int boxes = BoxCount(p, s, pl);
        ASSERT_LE(boxes, 6);
        for (int i = 0; i < boxes; ++i) {
          const Box b = BoxAt(p, s, e, lo, pl, kt, i);
          const BoxExtent ex = MapBox(p, b.map, tile_n);
          ASSERT_EQ(ex.inner * 2, kSwizzleRowBytes);
          ASSERT_EQ(b.smem % kSwizzleAtomBytes, 0u);
          ASSERT_LE(b.smem + static_cast<uint32_t>(ex.outer * kSwizzleRowBytes),
                    static_cast<uint32_t>(stage_bytes));
          bytes += static_cast<uint32_t>(ex.inner * ex.outer * 2);
          const Global& g = run.maps[b.map];
          for (int r = 0; r < ex.outer; ++r) {
            for (int c = 0; c < ex.inner; ++c) {
              const uint32_t at = Swizzle128(b.smem + static_cast<uint32_t>(r * 128 + 2 * c)) / 2;
              ASSERT_EQ(covered[at]++, 0) << "two boxes write one element";
              smem[at] =
                  MapIs3d(p, b.map) ? g.At(b.c0 + c, b.c1 + r, b.c2) : g.At(b.c0 + c, b.c1 + r, 0);
            }
          }
        }
        ASSERT_EQ(StageBytes(p, s, pl), bytes);
        // The weight grad's rows past the expert.
        const int64_t valid = hi - (lo + kt * kTileK);
        if (wgrad && valid < kTileK) {
          for (int i = 0; i < stage_bytes / 16; ++i) {
            if (!ChunkPastRows(i, valid)) continue;
            for (int j = 0; j < 8; ++j) smem[8 * i + j] = 0.0;
          }
        }
        // The consumers' wgmma steps.
        for (int w = 0; w < 2; ++w) {
          for (int kk = 0; kk < kTileK / kWgmmaK; ++kk) {
            const uint64_t da = MakeDescriptor(DescriptorStart(AMnMajor(p), 64 * w, kk),
                                               DescriptorLbo(AMnMajor(p)), DescriptorSbo());
            const uint64_t db = MakeDescriptor(kStageABytes + DescriptorStart(BMnMajor(p), 0, kk),
                                               DescriptorLbo(BMnMajor(p)), DescriptorSbo());
            for (int mm = 0; mm < 64; ++mm) {
              for (int k = 0; k < kWgmmaK; ++k) {
                ta[mm * kWgmmaK + k] = smem[WgmmaElementOffset(da, AMnMajor(p), mm, k) / 2];
              }
            }
            for (int n = 0; n < tile_n; ++n) {
              for (int k = 0; k < kWgmmaK; ++k) {
                tb[n * kWgmmaK + k] = smem[WgmmaElementOffset(db, BMnMajor(p), n, k) / 2];
              }
            }
            for (int mm = 0; mm < 64; ++mm) {
              for (int n = 0; n < tile_n; ++n) {
                double sum = 0;
                for (int k = 0; k < kWgmmaK; ++k) sum += ta[mm * kWgmmaK + k] * tb[n * kWgmmaK + k];
                acc[(w * 64 + mm) * tile_n + n] += sum;
              }
            }
          }
        }
      }
      // The epilogue: thread tid's register r of warpgroup w.
      const int64_t row_end = wgrad ? s.c_rows : hi;
      double* ct = wgrad ? run.c + e * s.c_rows * s.n_out : run.c;
      for (int w = 0; w < 2; ++w) {
        for (int tid = 0; tid < 128; ++tid) {
          const int regs = p == Product::kGlu ? AccRegs(tile_n) / 2 : AccRegs(tile_n);
          for (int r = 0; r < regs; ++r) {
            const int64_t row = pl.c_row0 + 64 * w + AccRow(tid, r);
            const int64_t col = pl.c_col0 + AccCol(tid, r);
            if (row >= row_end || col >= s.n_out) continue;
            const double v = acc[(w * 64 + AccRow(tid, r)) * tile_n + AccCol(tid, r)];
            const int64_t at = row * s.n_out + col;
            if (p == Product::kGlu) {
              const int ru = r + AccRegs(tile_n) / 2;  // the kernel's register of u
              const double u = acc[(w * 64 + AccRow(tid, ru)) * tile_n + AccCol(tid, ru)];
              ct[at] = GluValueHost(run.act, v, u);
              if (run.glu_a != nullptr) {
                run.glu_a[at] = v;
                run.glu_u[at] = u;
              }
            } else {
              ct[at] = (wgrad || run.add) ? ct[at] + v : v;
            }
          }
        }
      }
    }
  }
}

// Ragged counts with empty experts, tile edges and an expert longer than 4 stages; before_pad
// NaN rows before the first expert and after_pad after the last (0: the last tile runs past M).
Problem MakeProblem(int64_t before_pad, int64_t after_pad) {
  Problem p;
  p.off = {before_pad};
  for (int64_t c : {int64_t{0}, int64_t{1}, int64_t{130}, int64_t{3}, int64_t{257}, int64_t{0}}) {
    p.off.push_back(p.off.back() + c);
  }
  p.m = p.off.back() + after_pad;
  return p;
}

Tensor Offsets(const Problem& p) {
  return Tensor::FromVector<int64_t>({static_cast<int64_t>(p.off.size())}, p.off);
}

GemmShape RowShape(const Problem& p, int64_t n_out, int64_t k_sum, Product prod, int tile_n) {
  GemmShape s{};
  s.tile_n = tile_n;
  s.num_experts = static_cast<int>(p.off.size()) - 1;
  s.m = p.m;
  s.tiles_n = CeilDiv(n_out, ColTile(prod, tile_n));
  s.k_tiles = CeilDiv(k_sum, kTileK);
  s.n_out = n_out;
  s.c_rows = p.m;
  return s;
}

// Rows outside the experts keep the sentinel; inside, got == want exactly (or within rel_tol).
void ExpectRows(const Problem& p, const Tensor& got, const Tensor& want, double rel_tol,
                const std::string& what) {
  const int64_t cols = got.dim(1);
  for (int64_t r = 0; r < p.m; ++r) {
    const bool inside = r >= p.off.front() && r < p.off.back();
    for (int64_t c = 0; c < cols; ++c) {
      const double g = got.data<double>()[r * cols + c];
      if (!inside) {
        ASSERT_EQ(g, kSentinel) << what << ": row " << r << " outside the experts written";
        continue;
      }
      const double v = want.data<double>()[r * cols + c];
      ASSERT_NEAR(g, v, rel_tol * (1 + std::abs(v))) << what << ": row " << r << ", col " << c;
    }
  }
}

Tensor Filled(const Shape& shape, double v) {
  Tensor t = Tensor::Empty(shape, DType::kF64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = v;
  return t;
}

// (padding case, tile width).
class GroupedGemmWgmmaEmulation : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(GroupedGemmWgmmaEmulation, ProductsMatchTheTwin) {
  // N, K multiples of 8 but not of the tiles: 2 column tiles of 256 + 8, stages of 64 + 8.
  const int64_t e = 6, n = 264, k = 72;
  const auto [padding, tile_n] = GetParam();
  const Problem p = padding == 0 ? MakeProblem(3, 0) : MakeProblem(2, 5);
  const Tensor offsets = Offsets(p);
  PhiloxGenerator rng(24, static_cast<uint64_t>(padding));
  Tensor x = SmallInts({p.m, k}, rng), dy = SmallInts({p.m, n}, rng);
  const Tensor w = SmallInts({e, n, k}, rng);
  PoisonOutside(p, &x);
  PoisonOutside(p, &dy);
  const Global gx{k, p.m, 1, x.data<double>()}, gdy{n, p.m, 1, dy.data<double>()};
  const Global gw{k, n, e, w.data<double>()};

  {  // Forward.
    Tensor y = Filled({p.m, n}, kSentinel), y_ref = Filled({p.m, n}, kSentinel);
    Launch run(Product::kForward, RowShape(p, n, k, Product::kForward, tile_n), gx, gw, gw);
    run.c = y.data<double>();
    Emulate(p, run);
    ASSERT_TRUE(GroupedGemmForward(x, w, offsets, &y_ref).ok());
    ExpectRows(p, y, y_ref, 0, "forward");
  }
  {  // Input grad, accumulated onto a start.
    const Tensor start = SmallInts({p.m, k}, rng);
    Tensor dx = start.Clone(), dx_ref = start.Clone();
    for (int64_t r = 0; r < p.m; ++r) {
      if (r >= p.off.front() && r < p.off.back()) continue;
      for (int64_t c = 0; c < k; ++c) dx.data<double>()[r * k + c] = kSentinel;
    }
    Launch run(Product::kInputGrad, RowShape(p, k, n, Product::kInputGrad, tile_n), gdy, gw, gw);
    run.c = dx.data<double>();
    run.add = true;
    Emulate(p, run);
    ASSERT_TRUE(GroupedGemmInputGrad(dy, w, offsets, true, &dx_ref).ok());
    for (int64_t r = 0; r < p.m; ++r) {
      if (r >= p.off.front() && r < p.off.back()) continue;
      for (int64_t c = 0; c < k; ++c) dx_ref.data<double>()[r * k + c] = kSentinel;
    }
    ExpectRows(p, dx, dx_ref, 0, "input grad");
  }
  {  // Weight grad, accumulated onto a start.
    const Tensor dw0 = SmallInts({e, n, k}, rng);
    Tensor dw = dw0.Clone(), dw_ref = dw0.Clone();
    GemmShape s{};
    s.num_experts = static_cast<int>(e);
    s.m = p.m;
    s.tiles_m = CeilDiv(n, kTileM);
    s.tile_n = tile_n;
    s.tiles_n = CeilDiv(k, tile_n);
    s.n_out = k;
    s.c_rows = n;
    Launch run(Product::kWeightGrad, s, gdy, gx, gx);
    run.c = dw.data<double>();
    Emulate(p, run);
    ASSERT_TRUE(GroupedGemmWeightGrad(dy, x, offsets, &dw_ref).ok());
    for (int64_t i = 0; i < dw.numel(); ++i) {
      ASSERT_EQ(dw.data<double>()[i], dw_ref.data<double>()[i])
          << "weight grad: expert " << i / (n * k) << ", row " << (i / k) % n << ", col " << i % k;
    }
  }
  {  // The fused GLU: h, a, u; F = 136 (a 128-column tile and 8 more).
    const int64_t f = 136;
    const Tensor w1 = SmallInts({e, f, k}, rng), w3 = SmallInts({e, f, k}, rng);
    const Global g1{k, f, e, w1.data<double>()}, g3{k, f, e, w3.data<double>()};
    GluActivation act;
    act.beta = 5.0;
    act.beta_lin = 20.0;
    Tensor h = Filled({p.m, f}, kSentinel), a = Filled({p.m, f}, kSentinel);
    Tensor u = Filled({p.m, f}, kSentinel);
    Launch run(Product::kGlu, RowShape(p, f, k, Product::kGlu, tile_n), gx, g1, g3);
    run.c = h.data<double>();
    run.glu_a = a.data<double>();
    run.glu_u = u.data<double>();
    run.act = act;
    Emulate(p, run);
    Tensor h_ref = Filled({p.m, f}, kSentinel), a_ref = Filled({p.m, f}, kSentinel);
    Tensor u_ref = Filled({p.m, f}, kSentinel);
    ASSERT_TRUE(GroupedGemmGlu(act, x, w1, w3, offsets, &h_ref, &a_ref, &u_ref).ok());
    ExpectRows(p, a, a_ref, 0, "glu a");
    ExpectRows(p, u, u_ref, 0, "glu u");
    ExpectRows(p, h, h_ref, 1e-12, "glu h");  // two f64 evaluations of the same formula
  }
}

// Padding 0: NaN rows before the experts, the last expert's tiles run past M (TMA's zero fill);
// 1: NaN rows on both sides. Tiles of 256 and of 128 columns.
INSTANTIATE_TEST_SUITE_P(PaddingAndWidth, GroupedGemmWgmmaEmulation,
                         ::testing::Combine(::testing::Values(0, 1),
                                            ::testing::Values(kWideTileN, kNarrowTileN)));

}  // namespace
}  // namespace orrery::kernels::cuda::grouped_gemm_wgmma
