// The Hopper primitives of the wgmma attention forward, one layer per test (wgmma_probe.h), on
// known matrices; skipped without a GPU. Inputs are small integers, so every product and sum is
// exact in f32 (|S| <= 192 is exact in bf16 too) and results must match the plain products
// exactly: any difference is a layout error of the layer the test names, and the first wrong
// element is printed. Read in order: a failing TMA box makes everything after it fail too.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/philox.h"
#include "kernels/cuda/wgmma_layout.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/wgmma_probe.h"

namespace orrery::kernels::wgmma_probe {
namespace {

std::vector<float> Ints(int count, int lo, int hi, uint64_t seed) {
  PhiloxGenerator rng(seed, 0);
  std::vector<float> x(count);
  for (float& v : x) v = static_cast<float>(lo + static_cast<int>(rng.UniformInt(hi - lo + 1)));
  return x;
}

// got [64][cols] equals want exactly; the first difference is reported with its (row, column).
void ExpectSame(const std::vector<float>& got, const std::vector<float>& want, int cols,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << what << ": first wrong element (row " << i / cols << ", column "
                               << i % cols << ")";
  }
}

// Rows a0 .. a0 + 63 of a [*][k] times b [n][k] transposed: [64][n].
std::vector<float> ProductABt(const std::vector<float>& a, int a0, const std::vector<float>& b,
                              int k, int n) {
  std::vector<float> d(64 * n, 0.0f);
  for (int m = 0; m < 64; ++m) {
    for (int j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int c = 0; c < k; ++c) acc += double{a[(a0 + m) * k + c]} * b[j * k + c];
      d[m * n + j] = static_cast<float>(acc);
    }
  }
  return d;
}
// a [64][k] times b [k][n]: [64][n].
std::vector<float> ProductAB(const std::vector<float>& a, const std::vector<float>& b, int k,
                             int n) {
  std::vector<float> d(64 * n, 0.0f);
  for (int m = 0; m < 64; ++m) {
    for (int j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int c = 0; c < k; ++c) acc += double{a[m * k + c]} * b[c * n + j];
      d[m * n + j] = static_cast<float>(acc);
    }
  }
  return d;
}

TEST(WgmmaProbeGpuTest, TmaBoxLandsSwizzledAndZeroFilled) {
  SKIP_WITHOUT_GPU();
  constexpr int kRowsX = 200, kColsX = 192;
  const std::vector<float> x = Ints(kRowsX * kColsX, -100, 100, 1);
  // A box inside the matrix, and one past its last row (rows >= 200 read as zero).
  for (const auto& [x0, y0] : std::vector<std::pair<int, int>>{{64, 3}, {128, 150}}) {
    std::vector<float> smem;
    const Status st = TmaBox(x, kRowsX, kColsX, x0, y0, &smem);
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (int r = 0; r < 128; ++r) {
      for (int c = 0; c < 64; ++c) {
        const float want = y0 + r < kRowsX ? x[(y0 + r) * kColsX + x0 + c] : 0.0f;
        ASSERT_EQ(smem[cuda::wgmma::Sw128Offset(r, c) / 2], want)
            << "box at (" << x0 << ", " << y0 << "): element (" << r << ", " << c
            << ") not at its 128-byte-swizzled place";
      }
    }
  }
}

// N = 128 is S = Q K^T of the forward, N = 64 S and dP of the dq pass.
TEST(WgmmaProbeGpuTest, ProductSSWithKMajorDescriptors) {
  SKIP_WITHOUT_GPU();
  for (const int k : {192, 128}) {
    for (const int b_rows : {128, 64}) {
      const std::vector<float> a = Ints(128 * k, -4, 4, 10 + k),
                               b = Ints(b_rows * k, -4, 4, 20 + k + b_rows);
      for (const int half : {0, 1}) {
        std::vector<float> d;
        const Status st = ProductSS(a, b, k, b_rows, half, &d);
        ASSERT_TRUE(st.ok()) << st.ToString();
        ExpectSame(d, ProductABt(a, 64 * half, b, k, b_rows), b_rows,
                   "A B^T (m64n" + std::to_string(b_rows) +
                       "k16, K-major descriptors, accumulator map), k " + std::to_string(k) +
                       ", rows from " + std::to_string(64 * half));
      }
    }
  }
}

// (k, n) = (128, 128) is O += P V of the forward, (64, 192) and (64, 128) dQ += dS K of the dq
// pass.
TEST(WgmmaProbeGpuTest, ProductRSWithTransposedB) {
  SKIP_WITHOUT_GPU();
  for (const auto& [k, n] : std::vector<std::pair<int, int>>{{128, 128}, {64, 192}, {64, 128}}) {
    const std::vector<float> a = Ints(64 * k, -4, 4, 30 + k), b = Ints(k * n, -4, 4, 31 + n);
    std::vector<float> d;
    const Status st = ProductRS(a, b, k, n, &d);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectSame(d, ProductAB(a, b, k, n), n,
               "A B (m64n" + std::to_string(n) +
                   "k16, A-fragment map, MN-major descriptor of B), k " + std::to_string(k));
  }
}

TEST(WgmmaProbeGpuTest, ChainRepacksScoresAsTheNextOperand) {
  SKIP_WITHOUT_GPU();
  for (const int dqk : {192, 128}) {
    // Q, K in {-1, 0, 1}: |S| <= dqk, exact in bf16, so bf16(S) V is exact as well.
    const std::vector<float> q = Ints(128 * dqk, -1, 1, 40 + dqk),
                             k = Ints(128 * dqk, -1, 1, 50 + dqk), v = Ints(128 * 128, -4, 4, 60);
    for (const int half : {0, 1}) {
      std::vector<float> s, o;
      const Status st = Chain(q, k, v, dqk, half, &s, &o);
      ASSERT_TRUE(st.ok()) << st.ToString();
      const std::vector<float> s_want = ProductABt(q, 64 * half, k, dqk, 128);
      ExpectSame(s, s_want, 128, "S = Q K^T, dqk " + std::to_string(dqk));
      ExpectSame(o, ProductAB(s_want, v, 128, 128), 128,
                 "O = P V with P repacked from S's accumulators (AccumulatorOfA), dqk " +
                     std::to_string(dqk));
    }
  }
}

}  // namespace
}  // namespace orrery::kernels::wgmma_probe
