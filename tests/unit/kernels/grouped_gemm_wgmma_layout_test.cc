// The wgmma grouped GEMM's index arithmetic (kernels/cuda/grouped_gemm_wgmma_layout.h), without a
// GPU:
//   - every element that the kernel's wgmma descriptors address (per the PTX ISA's canonical
//     K-major and MN-major layouts under the 128-byte swizzle) is the element its TMA boxes put
//     there, for each operand of each product, each consumer warpgroup and each k16 step, in a
//     stage that is not the first (a wrong LBO/SBO, a swapped pair, a wrong k step or warpgroup
//     offset reads another element and fails here);
//   - the descriptor's bit fields (start, LBO, SBO >> 4; layout type 1 in bits 62-63);
//   - the accumulator map covers the 64 x 256 result once, with each even register's pair in
//     adjacent columns of one row (the epilogue stores pairs);
//   - the tile schedule, run as the kernel's warps run it (chunks of 32 experts, the prefix
//     resumed from the last tile) by every CTA of persistent grids: every C element of every
//     expert (ragged counts, empty experts, one expert with all rows) in exactly one tile, no
//     tile past the last, and the boxes a tile loads cover its columns.
#include "kernels/cuda/grouped_gemm_wgmma_layout.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/philox.h"

namespace orrery::kernels::cuda::grouped_gemm_wgmma {
namespace {

TEST(GroupedGemmWgmmaLayout, SwizzleIsTheChunkXorRowPermutation) {
  std::set<uint32_t> seen;
  for (uint32_t off = 0; off < 2 * kSwizzleAtomBytes; ++off) {
    const uint32_t s = Swizzle128(off);
    const uint32_t row = off / 128, chunk = (off / 16) % 8;
    EXPECT_EQ(s, row * 128 + 16 * (chunk ^ (row % 8)) + off % 16) << off;
    seen.insert(s);
  }
  EXPECT_EQ(seen.size(), 2u * kSwizzleAtomBytes);
}

TEST(GroupedGemmWgmmaLayout, DescriptorFields) {
  const uint64_t d = MakeDescriptor(0x12C00u, 8192, 1024);
  EXPECT_EQ(d & 0x3FFFu, 0x12C00u >> 4);
  EXPECT_EQ((d >> 16) & 0x3FFFu, 8192u >> 4);
  EXPECT_EQ((d >> 32) & 0x3FFFu, 1024u >> 4);
  EXPECT_EQ((d >> 49) & 7u, 0u);  // base offset: tiles 1024-byte aligned
  EXPECT_EQ(d >> 62, 1u);         // SWIZZLE_128B
  EXPECT_EQ((d >> 14) & 3u, 0u);  // reserved bits stay clear
  EXPECT_EQ((d >> 30) & 3u, 0u);
  EXPECT_EQ((d >> 46) & 7u, 0u);
  EXPECT_EQ((d >> 52) & 0x3FFu, 0u);
}

// One operand of one product as the kernel reads it.
struct Operand {
  std::string name;
  bool mn_major;
  int tile_mn;         // kTileM (A) or the tile width (B)
  bool per_warpgroup;  // A: each consumer warpgroup reads its 64 rows
};

TEST(GroupedGemmWgmmaLayout, DescriptorsReadWhatTmaWrote) {
  for (const int tile_n : {kWideTileN, kNarrowTileN}) {
    const std::string w = ", " + std::to_string(tile_n) + "-column tiles";
    const std::vector<Operand> ops = {
        {"forward/input-grad/glu A (X, dY: K-major)" + w, false, kTileM, true},
        {"forward/glu B (W_e: K-major)" + w, false, tile_n, false},
        {"weight-grad A (dY: MN-major)" + w, true, kTileM, true},
        {"input/weight-grad B (W_e, X: MN-major)" + w, true, tile_n, false},
    };
    const uint32_t stage = 2;  // a later stage: its offset must not disturb the swizzle
    for (const Operand& op : ops) {
      const bool b = !op.per_warpgroup;
      const uint32_t tile = stage * StageBytes(tile_n) + (b ? kStageABytes : 0);
      ASSERT_EQ(tile % kSwizzleAtomBytes, 0u);
      // What TMA wrote: every element of the tile at a distinct byte inside the tile.
      std::set<uint32_t> written;
      for (int mn = 0; mn < op.tile_mn; ++mn) {
        for (int k = 0; k < kTileK; ++k) {
          const uint32_t at = TmaElementOffset(op.mn_major, mn, k);
          ASSERT_LT(at, static_cast<uint32_t>(op.tile_mn * kTileK * 2)) << op.name;
          written.insert(at);
        }
      }
      ASSERT_EQ(written.size(), static_cast<size_t>(op.tile_mn * kTileK)) << op.name;
      const int parts = op.per_warpgroup ? op.tile_mn / 64 : 1;
      const int extent = op.per_warpgroup ? 64 : op.tile_mn;  // m64 (A) or n256 (B)
      for (int w = 0; w < parts; ++w) {
        const int mn0 = op.per_warpgroup ? 64 * w : 0;
        for (int kk = 0; kk < kTileK / kWgmmaK; ++kk) {
          const uint64_t desc = MakeDescriptor(tile + DescriptorStart(op.mn_major, mn0, kk),
                                               DescriptorLbo(op.mn_major), DescriptorSbo());
          for (int mn = 0; mn < extent; ++mn) {
            for (int k = 0; k < kWgmmaK; ++k) {
              const uint32_t read = WgmmaElementOffset(desc, op.mn_major, mn, k);
              const uint32_t want =
                  tile + TmaElementOffset(op.mn_major, mn0 + mn, kk * kWgmmaK + k);
              ASSERT_EQ(read, want) << op.name << ": warpgroup " << w << ", k step " << kk
                                    << ", element (" << mn << ", " << k << ")";
            }
          }
        }
      }
    }
  }
}

TEST(GroupedGemmWgmmaLayout, AccumulatorsCoverTheResultOnce) {
  for (const int tile_n : {kWideTileN, kNarrowTileN}) {
    std::vector<int> count(64 * tile_n, 0);
    for (int tid = 0; tid < 128; ++tid) {
      for (int r = 0; r < AccRegs(tile_n); ++r) {
        const int row = AccRow(tid, r), col = AccCol(tid, r);
        ASSERT_GE(row, 0);
        ASSERT_LT(row, 64);
        ASSERT_GE(col, 0);
        ASSERT_LT(col, tile_n);
        ++count[row * tile_n + col];
        if (r % 2 == 0) {
          EXPECT_EQ(AccRow(tid, r + 1), row);
          EXPECT_EQ(AccCol(tid, r + 1), col + 1);
          EXPECT_EQ(col % 2, 0);
        }
      }
    }
    for (int i = 0; i < 64 * tile_n; ++i) ASSERT_EQ(count[i], 1) << "element " << i;
  }
}

// The device's FindTile on the host: a warp's 32 lanes as a loop, the same cursor.
struct Cursor {
  int e_base = 0;
  int64_t before = 0;
};
struct Found {
  int expert;
  int64_t local, lo, hi;
};

bool FindTileHost(const std::vector<int64_t>& off, int64_t m, bool wgrad, int64_t tiles_m,
                  int64_t tiles_n, int64_t idx, Cursor* cur, Found* f) {
  const int e_count = static_cast<int>(off.size()) - 1;
  while (cur->e_base < e_count) {
    int64_t lo[32], hi[32], tiles[32], incl[32];
    for (int lane = 0; lane < 32; ++lane) {
      const int e = cur->e_base + lane;
      lo[lane] = hi[lane] = tiles[lane] = 0;
      if (e < e_count) {
        ClampRows(off[e], off[e + 1], m, &lo[lane], &hi[lane]);
        tiles[lane] = ExpertTiles(wgrad, hi[lane] - lo[lane], tiles_m, tiles_n);
      }
      incl[lane] = tiles[lane] + (lane > 0 ? incl[lane - 1] : 0);
    }
    if (idx < cur->before + incl[31]) {
      int src = -1;
      for (int lane = 0; lane < 32; ++lane) {
        if (idx >= cur->before + incl[lane] - tiles[lane] && idx < cur->before + incl[lane]) {
          EXPECT_EQ(src, -1) << "two lanes claim tile " << idx;
          if (src < 0) src = lane;
        }
      }
      EXPECT_GE(src, 0);
      f->expert = cur->e_base + src;
      f->local = idx - cur->before - (incl[src] - tiles[src]);
      f->lo = lo[src];
      f->hi = hi[src];
      return true;
    }
    cur->before += incl[31];
    cur->e_base += 32;
  }
  return false;
}

// Runs the schedule of every CTA of a grid and counts, per C element, the tiles that write it.
// col_tile: the tile width, or half of it for the fused GLU.
void CheckSchedule(const std::vector<int64_t>& off, int64_t m, bool wgrad, int64_t n_rows,
                   int64_t n_out, int64_t k_sum, int64_t grid, int col_tile,
                   const std::string& what) {
  const int64_t e_count = static_cast<int64_t>(off.size()) - 1;
  const int64_t tiles_m = wgrad ? CeilDiv(n_rows, kTileM) : 0;
  const int64_t tiles_n = CeilDiv(n_out, col_tile);
  const int64_t row_k_tiles = CeilDiv(k_sum, kTileK);
  // Row products: C is [m, n_out]; weight grad: E stacked [n_rows, n_out].
  const int64_t c_rows = wgrad ? e_count * n_rows : m;
  std::vector<uint8_t> hits(static_cast<size_t>(c_rows * n_out), 0);
  int64_t tiles_done = 0;
  for (int64_t b = 0; b < grid; ++b) {
    Cursor cur;
    for (int64_t idx = b;; idx += grid) {
      Found f;
      if (!FindTileHost(off, m, wgrad, tiles_m, tiles_n, idx, &cur, &f)) break;
      // A fresh cursor finds the same tile (the resumed walk skips nothing).
      Cursor fresh;
      Found g;
      ASSERT_TRUE(FindTileHost(off, m, wgrad, tiles_m, tiles_n, idx, &fresh, &g)) << what;
      ASSERT_EQ(g.expert, f.expert) << what;
      ASSERT_EQ(g.local, f.local) << what;
      ++tiles_done;
      const TilePlace p = PlaceTile(wgrad, f.local, f.lo, f.hi, tiles_n, row_k_tiles, col_tile);
      ASSERT_EQ(p.k_tiles, wgrad ? CeilDiv(f.hi - f.lo, kTileK) : row_k_tiles) << what;
      ASSERT_GT(p.k_tiles, 0) << what << ": a tile with nothing to reduce";
      const int64_t row_end = wgrad ? n_rows : f.hi;
      ASSERT_LT(p.c_row0, row_end) << what << ": a tile wholly past its rows";
      ASSERT_LT(p.c_col0, n_out) << what;
      // The boxes loaded over the columns (and, for the weight grad, the rows) reach the edge.
      const int boxes_n = BoxesInside(n_out, p.c_col0, col_tile);
      ASSERT_GE(p.c_col0 + boxes_n * kMnBlock, std::min<int64_t>(n_out, p.c_col0 + col_tile))
          << what;
      ASSERT_LE(boxes_n, col_tile / kMnBlock);
      if (wgrad) {
        const int boxes_m = BoxesInside(n_rows, p.c_row0, kTileM);
        ASSERT_GE(p.c_row0 + boxes_m * kMnBlock, std::min(n_rows, p.c_row0 + kTileM)) << what;
      }
      for (int64_t i = p.c_row0; i < std::min(p.c_row0 + kTileM, row_end); ++i) {
        for (int64_t j = p.c_col0; j < std::min<int64_t>(p.c_col0 + col_tile, n_out); ++j) {
          const int64_t r = wgrad ? f.expert * n_rows + i : i;
          ++hits[static_cast<size_t>(r * n_out + j)];
        }
      }
    }
  }
  int64_t want_tiles = 0;
  for (int64_t e = 0; e < e_count; ++e) {
    int64_t lo, hi;
    ClampRows(off[e], off[e + 1], m, &lo, &hi);
    want_tiles += ExpertTiles(wgrad, hi - lo, tiles_m, tiles_n);
    const bool rows = hi > lo;
    const int64_t r0 = wgrad ? e * n_rows : lo, r1 = wgrad ? (e + 1) * n_rows : hi;
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t j = 0; j < n_out; ++j) {
        ASSERT_EQ(hits[static_cast<size_t>(r * n_out + j)], wgrad ? (rows ? 1 : 0) : 1)
            << what << ": expert " << e << ", C (" << r << ", " << j << ")";
        hits[static_cast<size_t>(r * n_out + j)] = 0;
      }
    }
  }
  for (size_t i = 0; i < hits.size(); ++i) {
    ASSERT_EQ(hits[i], 0) << what << ": C element " << i << " outside every expert written";
  }
  EXPECT_EQ(tiles_done, want_tiles) << what;
}

TEST(GroupedGemmWgmmaLayout, ScheduleCoversEveryExpertTileOnce) {
  PhiloxGenerator rng(24, 4);
  struct Counts {
    std::string name;
    std::vector<int64_t> counts;
  };
  std::vector<Counts> cases;
  {
    std::vector<int64_t> c = {0, 1, 127, 128, 129, 300, 0, 0, 255, 256, 257};
    for (int i = 0; i < 60; ++i) c.push_back(rng.NextU32() % 200);  // > 64 experts: 3 chunks
    cases.push_back({"ragged", c});
  }
  cases.push_back({"one expert has all", {0, 0, 0, 777, 0, 0, 0, 0}});
  cases.push_back({"all empty but the last", std::vector<int64_t>(40, 0)});
  cases.back().counts.back() = 130;
  for (const Counts& c : cases) {
    std::vector<int64_t> off = {3};  // rows before the first expert's, as the tests poison
    for (int64_t n : c.counts) off.push_back(off.back() + n);
    const int64_t m = off.back() + 5;
    for (const int64_t grid : {int64_t{1}, int64_t{7}, int64_t{132}}) {
      const std::string g = c.name + ", grid " + std::to_string(grid);
      // Row products: N (forward) or K (input grad) columns, partial column tiles included.
      for (const int tile_n : {kWideTileN, kNarrowTileN}) {
        const std::string t = g + ", " + std::to_string(tile_n) + "-column tiles";
        CheckSchedule(off, m, false, 0, 72, 136, grid, tile_n, t + ", row product 72 cols");
        CheckSchedule(off, m, false, 0, 520, 64, grid, tile_n, t + ", row product 520 cols");
        // The fused GLU: h tiles of half the width.
        CheckSchedule(off, m, false, 0, 392, 64, grid, ColTile(Product::kGlu, tile_n),
                      t + ", glu 392 cols");
        // Weight grad: dW_e [N, K] tiles of 128 x tile_n.
        CheckSchedule(off, m, true, 136, 72, 0, grid, tile_n, t + ", weight grad 136 x 72");
        CheckSchedule(off, m, true, 264, 600, 0, grid, tile_n, t + ", weight grad 264 x 600");
      }
    }
  }
}

}  // namespace
}  // namespace orrery::kernels::cuda::grouped_gemm_wgmma
