// The tensor-core attention kernels' tile and fragment index arithmetic
// (kernels/cuda/attention_tc_layout.h) on a simulated warp, against the PTX ISA's definitions of
// ldmatrix.m8n8.x4 (with and without .trans) and mma.m16n8k16 (section "Matrix Fragments for
// mma.m16n8k16"), so that a wrong fragment index fails here, without a GPU, instead of as a
// garbled attention output on one. Tiles hold small integers (exact sums in double), laid out
// with SwizzledElement in the second of two stages (the kernels add a stage offset to the lane
// bases), and each product the kernels form is checked against the plain matrix product:
//   C = X Y^T with X as the A operand (LoadFragA, row order) and Y as the "col" B operand
//   (LoadFragBT2, column order): S = Q K^T, S^T = K Q^T, dP = dO V^T, dP^T = V dO^T;
//   D = C Z with C's accumulators as the A operand (AccumulatorsAsA) and Z as the row-major B
//   operand (LoadFragB2, .trans, row order): P V, P^T dO, dS^T Q, dS K.
// And the tile ranges, warp skips and masks of causal attention within documents: every visible
// (query, key) pair computed exactly once by each kernel, no hidden one.
#include "kernels/cuda/attention_tc_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/philox.h"

namespace orrery::kernels::cuda::attention_tc {
namespace {

using Reg = std::array<double, 2>;                  // a 32-bit register: two b16 (low half first)
using Regs4 = std::array<std::array<Reg, 4>, 32>;   // 4 registers of each of 32 lanes
using Acc = std::array<std::array<double, 4>, 32>;  // one m16n8 f32 accumulator per lane

// Shared memory as b16 elements; addresses are byte offsets from a 128-byte aligned start.
struct Smem {
  std::vector<double> mem;
  std::array<double, 8> Row(uint32_t addr) const {  // the 16 bytes at addr (one ldmatrix row)
    EXPECT_EQ(addr % 16, 0u) << "ldmatrix row address " << addr << " not 16-byte aligned";
    std::array<double, 8> r{};
    for (int c = 0; c < 8; ++c) r[c] = mem.at(addr / 2 + c);
    return r;
  }
};

// ldmatrix.x4 (.trans): lane l gives addr[l], the row l % 8 of matrix l / 8. Without .trans lane l
// receives, in register i, row l / 4, elements 2 (l % 4) and + 1 of matrix i; with .trans, rows
// 2 (l % 4) and + 1 at column l / 4.
Regs4 LdMatrixX4(const Smem& s, const std::array<uint32_t, 32>& addr, bool trans) {
  std::array<std::array<std::array<double, 8>, 8>, 4> m{};
  for (int l = 0; l < 32; ++l) m[l / 8][l % 8] = s.Row(addr[l]);
  Regs4 out{};
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < 4; ++i) {
      const int g = l / 4, t = l % 4;
      out[l][i] =
          trans ? Reg{m[i][2 * t][g], m[i][2 * t + 1][g]} : Reg{m[i][g][2 * t], m[i][g][2 * t + 1]};
    }
  }
  return out;
}

// mma.m16n8k16 with f32 accumulation: lane l (g = l / 4, t = l % 4) holds
// A: a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..];
// B: b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]; C: c0, c1 = C[g][2t..], c2, c3 = C[g+8][2t..].
void Mma(Acc& c, const std::array<std::array<Reg, 4>, 32>& a,
         const std::array<std::array<Reg, 2>, 32>& b) {
  double am[16][16] = {}, bm[16][8] = {};
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int h = 0; h < 2; ++h) {
      am[g][2 * t + h] = a[l][0][h];
      am[g + 8][2 * t + h] = a[l][1][h];
      am[g][2 * t + 8 + h] = a[l][2][h];
      am[g + 8][2 * t + 8 + h] = a[l][3][h];
      bm[2 * t + h][g] = b[l][0][h];
      bm[2 * t + 8 + h][g] = b[l][1][h];
    }
  }
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e / 2), col = 2 * t + (e % 2);
      for (int kk = 0; kk < 16; ++kk) c[l][e] += am[row][kk] * bm[kk][col];
    }
  }
}

// The two B fragments of an ldmatrix.x4 pair (registers 0-1 and 2-3) as in MmaPair.
std::array<std::array<Reg, 2>, 32> Half(const Regs4& b, int which) {
  std::array<std::array<Reg, 2>, 32> out{};
  for (int l = 0; l < 32; ++l) out[l] = {b[l][2 * which], b[l][2 * which + 1]};
  return out;
}

// A [rows][cols] matrix of small integers, and its swizzled tile at byte offset `base` of s.
std::vector<double> RandomMatrix(int rows, int cols, PhiloxGenerator& rng) {
  std::vector<double> m(static_cast<size_t>(rows) * cols);
  for (double& x : m) x = static_cast<double>(static_cast<int>(rng.UniformInt(5)) - 2);
  return m;
}
void StoreSwizzled(const std::vector<double>& m, int rows, int cols, uint32_t base, Smem* s) {
  s->mem.assign(base / 2 + static_cast<size_t>(rows) * cols, -1e9);  // stage 0: poison
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) s->mem[base / 2 + SwizzledElement(r, c, cols)] = m[r * cols + c];
  }
}

std::array<uint32_t, 32> Addresses(uint32_t base, int cols, bool row_order, int row0, int col0) {
  std::array<uint32_t, 32> a{};
  for (int l = 0; l < 32; ++l) {
    a[l] = FragmentAddress(base + LaneByteOffset(l, cols, row_order), cols, row0, col0);
  }
  return a;
}

// One warp's 16 rows (row0 ..) of C = X Y^T and then D = C Z, as the kernels form them, checked
// element by element. X [x_rows][kx], Y [y_rows][kx], Z [y_rows][nz].
void CheckProducts(int x_rows, int y_rows, int kx, int nz, uint64_t seed) {
  SCOPED_TRACE("x_rows " + std::to_string(x_rows) + " y_rows " + std::to_string(y_rows) + " kx " +
               std::to_string(kx) + " nz " + std::to_string(nz));
  PhiloxGenerator rng(seed, 0);
  const std::vector<double> x = RandomMatrix(x_rows, kx, rng), y = RandomMatrix(y_rows, kx, rng),
                            z = RandomMatrix(y_rows, nz, rng);
  // Each tile in stage 1 of a two-stage buffer, as the streamed tiles are.
  const uint32_t xb = static_cast<uint32_t>(x_rows * kx * 2), yb = y_rows * kx * 2,
                 zb = y_rows * nz * 2;
  Smem xs, ys, zs;
  StoreSwizzled(x, x_rows, kx, xb, &xs);
  StoreSwizzled(y, y_rows, kx, yb, &ys);
  StoreSwizzled(z, y_rows, nz, zb, &zs);

  for (int row0 = 0; row0 < x_rows; row0 += 16) {  // every warp of the block
    std::vector<Acc> c(y_rows / 8, Acc{});
    for (int kk = 0; kk < kx / 16; ++kk) {
      const Regs4 a = LdMatrixX4(xs, Addresses(xb, kx, true, row0, 16 * kk), false);
      for (int nn = 0; nn < y_rows / 16; ++nn) {
        const Regs4 b = LdMatrixX4(ys, Addresses(yb, kx, false, 16 * nn, 16 * kk), false);
        Mma(c[2 * nn], a, Half(b, 0));
        Mma(c[2 * nn + 1], a, Half(b, 1));
      }
    }
    for (int j = 0; j < y_rows / 8; ++j) {
      for (int l = 0; l < 32; ++l) {
        for (int e = 0; e < 4; ++e) {
          const int r = row0 + l / 4 + 8 * (e / 2), col = 8 * j + 2 * (l % 4) + e % 2;
          double want = 0.0;
          for (int d = 0; d < kx; ++d) want += x[r * kx + d] * y[col * kx + d];
          ASSERT_EQ(c[j][l][e], want) << "X Y^T row " << r << " column " << col;
        }
      }
    }

    std::vector<Acc> d(nz / 8, Acc{});
    for (int kk = 0; kk < y_rows / 16; ++kk) {
      std::array<std::array<Reg, 4>, 32> a{};  // AccumulatorsAsA(c[2 kk], c[2 kk + 1])
      for (int l = 0; l < 32; ++l) {
        for (int i = 0; i < 4; ++i) {
          const Acc& src = c[2 * kk + AccumulatorOfA(i)];
          a[l][i] = {src[l][AccumulatorElementOfA(i, 0)], src[l][AccumulatorElementOfA(i, 1)]};
        }
      }
      for (int nn = 0; nn < nz / 16; ++nn) {
        const Regs4 b = LdMatrixX4(zs, Addresses(zb, nz, true, 16 * kk, 16 * nn), true);
        Mma(d[2 * nn], a, Half(b, 0));
        Mma(d[2 * nn + 1], a, Half(b, 1));
      }
    }
    for (int j = 0; j < nz / 8; ++j) {
      for (int l = 0; l < 32; ++l) {
        for (int e = 0; e < 4; ++e) {
          const int r = row0 + l / 4 + 8 * (e / 2), col = 8 * j + 2 * (l % 4) + e % 2;
          double want = 0.0;
          for (int m = 0; m < y_rows; ++m) {
            double cm = 0.0;
            for (int dd = 0; dd < kx; ++dd) cm += x[r * kx + dd] * y[m * kx + dd];
            want += cm * z[m * nz + col];
          }
          ASSERT_EQ(d[j][l][e], want) << "(X Y^T) Z row " << r << " column " << col;
        }
      }
    }
  }
}

// The forward: S = Q K^T over 64-key tiles, then P V (qk 192 or 128, v 128).
TEST(AttentionTcLayout, ForwardProducts) {
  CheckProducts(64, 64, 192, 128, 1);
  CheckProducts(64, 64, 128, 128, 2);
}

// The backward's 32-row streamed tiles: S^T = K Q^T then dK's dS^T Q (Z = Q, 192 or 128 wide),
// dP^T = V dO^T then dV's P^T dO (128 wide), and the dq pass's S = Q K^T then dS K.
TEST(AttentionTcLayout, BackwardProducts) {
  CheckProducts(64, 32, 192, 192, 3);
  CheckProducts(64, 32, 128, 128, 4);
  CheckProducts(64, 32, 128, 192, 5);
}

// The swizzle is a permutation of each row's 16-byte pieces that keeps 8-element runs together.
TEST(AttentionTcLayout, SwizzleIsAPermutationOfPieces) {
  for (const int cols : {128, 192}) {
    for (int r = 0; r < 16; ++r) {
      std::vector<int> seen(cols, 0);
      for (int c = 0; c < cols; ++c) {
        const int off = SwizzledElement(r, c, cols) - r * cols;
        ASSERT_GE(off, 0);
        ASSERT_LT(off, cols);
        EXPECT_EQ(off % 8, c % 8);
        ++seen[off];
      }
      for (int c = 0; c < cols; ++c) EXPECT_EQ(seen[c], 1) << "cols " << cols << " row " << r;
    }
  }
}

// Visibility: each kernel's tile ranges, warp skips and per-tile masks (the functions of
// attention_tc_layout.h, in the kernels' loop structure) mark the (query, key) pairs they compute
// with a nonzero weight; every visible pair must be computed exactly once and no hidden pair at
// all (a padding row or key at or past n counts as hidden, except padding rows of the
// query-owning kernels, which are never written).
struct Layout {
  std::vector<int64_t> cu;
  int64_t n = 0;
  explicit Layout(const std::vector<int64_t>& lengths) : cu{0} {
    for (int64_t len : lengths) cu.push_back(cu.back() + len);
    n = cu.back();
  }
  int64_t Start(int64_t i) const {
    return DocStart(cu.data(), static_cast<int64_t>(cu.size()), n, i);
  }
  bool Visible(int64_t i, int64_t j) const {
    return i < n && j < n && j <= i && Start(i) == Start(j);
  }
};

constexpr int kRows = 64, kWarpRows = 16;

// Forward (key tiles of 64) and dq pass (32): blocks of 64 queries.
std::vector<int> QueryBlockCounts(const Layout& d, int tile) {
  const int64_t n = d.n;
  std::vector<int> count(static_cast<size_t>(n * (n + kRows)), 0);  // [query][key], keys padded
  for (int64_t q0 = 0; q0 < n; q0 += kRows) {
    const int64_t q_last = std::min<int64_t>(q0 + kRows, n) - 1;
    const int64_t kv_begin = d.Start(q0), last_start = d.Start(q_last);
    for (int it = 0; it < KeyTiles(kv_begin, q_last, tile); ++it) {
      const int64_t kb = kv_begin + int64_t{it} * tile;
      const bool wholly = KeyTileWhollyVisible(kb, tile, q0, last_start);
      for (int w = 0; w < kRows / kWarpRows; ++w) {
        const int64_t first = q0 + w * kWarpRows;
        const int64_t last = std::min(first + kWarpRows - 1, q_last);
        if (!WarpSeesKeyTile(kb, tile, d.Start(first), last)) continue;
        for (int64_t row = first; row < first + kWarpRows; ++row) {
          const int lo = ClampToTile(d.Start(row) - kb, tile), hi = ClampToTile(row - kb, tile);
          for (int c = 0; c < tile; ++c) {
            if (row < n && (wholly || (lo <= c && c <= hi))) ++count[row * (n + kRows) + kb + c];
          }
        }
      }
    }
  }
  return count;
}

// dk/dv pass: blocks of 64 keys streaming 32-query tiles.
std::vector<int> KeyBlockCounts(const Layout& d) {
  constexpr int kTile = 32;
  const int64_t n = d.n;
  std::vector<int> count(static_cast<size_t>((n + kRows) * n), 0);  // [query][key], queries padded
  for (int64_t k0 = 0; k0 < n; k0 += kRows) {
    const int64_t k_last = std::min<int64_t>(k0 + kRows, n) - 1;
    const int64_t q_stop =
        std::min(d.cu[DocOf(d.cu.data(), static_cast<int64_t>(d.cu.size()), k_last) + 1], n);
    for (int it = 0; it < QueryTiles(k0, q_stop, kTile); ++it) {
      const int64_t qb = k0 + int64_t{it} * kTile;
      int q_lo[kTile], q_hi[kTile];
      for (int c = 0; c < kTile; ++c) {
        q_lo[c] = ClampToTile(d.Start(qb + c) - k0, kRows);
        q_hi[c] = ClampToTile(qb + c - k0, kRows);
      }
      const bool wholly = QueryTileWhollyVisible(qb, k0, kRows, q_lo[kTile - 1]);
      for (int w = 0; w < kRows / kWarpRows; ++w) {
        if (!WarpSeesQueryTile(qb, kTile, k0, w * kWarpRows, q_lo[0])) continue;
        for (int key = w * kWarpRows; key < (w + 1) * kWarpRows; ++key) {
          for (int c = 0; c < kTile; ++c) {
            if (k0 + key < n && (wholly || (q_lo[c] <= key && key <= q_hi[c]))) {
              ++count[(qb + c) * n + k0 + key];
            }
          }
        }
      }
    }
  }
  return count;
}

void CheckVisibility(const std::vector<int64_t>& lengths) {
  const Layout d(lengths);
  const int64_t n = d.n;
  SCOPED_TRACE("n " + std::to_string(n));
  for (const int tile : {64, 32}) {
    const std::vector<int> count = QueryBlockCounts(d, tile);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n + kRows; ++j) {
        ASSERT_EQ(count[i * (n + kRows) + j], d.Visible(i, j) ? 1 : 0)
            << "query-owning blocks, key tile " << tile << ": query " << i << " key " << j;
      }
    }
  }
  const std::vector<int> count = KeyBlockCounts(d);
  for (int64_t i = 0; i < n + kRows; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_EQ(count[i * n + j], d.Visible(i, j) ? 1 : 0)
          << "key-owning blocks: query " << i << " key " << j;
    }
  }
}

TEST(AttentionTcLayout, TilesCoverEachVisiblePairOnce) {
  // The GPU tests' layouts, tile-aligned documents, empty ones, runs of 1-token documents.
  for (const auto& lengths : std::vector<std::vector<int64_t>>{
           {1, 63, 64, 65, 200, 1, 130, 17},
           {1, 7, 130, 0, 300, 45, 32},
           {64, 64, 128},
           {0, 5, 0},
           {1},
           {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
           {127, 0, 129, 31, 33},
           {700, 1, 300}}) {
    CheckVisibility(lengths);
  }
  PhiloxGenerator rng(77, 0);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int64_t> lengths(1 + rng.UniformInt(12));
    for (int64_t& len : lengths) len = static_cast<int64_t>(rng.UniformInt(trial % 2 ? 9 : 160));
    CheckVisibility(lengths);
  }
}

}  // namespace
}  // namespace orrery::kernels::cuda::attention_tc
