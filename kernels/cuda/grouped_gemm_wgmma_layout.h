// The index arithmetic of the wgmma grouped GEMM (grouped_gemm_wgmma.cu) as plain constexpr
// functions that host code runs too: tests/unit/kernels/grouped_gemm_wgmma_layout_test.cc checks,
// without a GPU, that every element the kernel's wgmma descriptors address is the element its TMA
// boxes put there, that the accumulator map covers the tile once, and that the tile schedule
// covers every (expert, tile) once.
//
// Shared-memory tiles. A stage holds a kTileK-deep slice of A (kTileM rows of C) and of B
// (tile_n = 256 or 128 columns of C: the launch's choice, GemmShape::tile_n), each loaded by TMA
// with the 128-byte swizzle: a box row of 128 bytes (64 bf16) has its 16-byte chunk c stored at
// chunk c ^ (row % 8), the pattern read off address bits 7-9, so every tile starts 1024-byte
// aligned. Two layouts, by which index is contiguous in global memory:
//   K-major (the reduction index contiguous: X and dY as A of the forward and input grad, W_e as
//     B of the forward): one box of [rows][64 k]; element (mn, k) at byte mn 128 + 2 k, swizzled.
//   MN-major (the C row or column index contiguous: W_e as B of the input grad, dY as A and X as
//     B of the weight grad): boxes of [64 k][64 mn], one per 64 of mn, kMnBlockBytes apart;
//     element (mn, k) at byte (mn / 64) kMnBlockBytes + 128 k + 2 (mn % 64), swizzled.
//
// wgmma reads an operand through a descriptor (start address, leading and stride byte offsets
// LBO and SBO, 128-byte swizzle), as the canonical layouts of the PTX ISA ("Shared Memory Matrix
// Layout"; T = 8 bf16 = 16 bytes):
//   K-major:  ((8, m), (T, 2)) : ((8T, SBO), (1, T))  element (mn, k < 16) at
//             start + 128 (mn % 8) + SBO (mn / 8) + 2 k;  LBO unused.
//   MN-major: ((T, 8, m), (8, k)) : ((1, T, LBO), (8T, SBO))  element (mn, k < 16) at
//             start + 2 (mn % 64) + LBO (mn / 64) + 128 (k % 8) + SBO (k / 8),
// then the swizzle on the address. So SBO = 1024 (8 rows of 128 bytes) in both, LBO =
// kMnBlockBytes for MN-major, and the k16 step kk of a stage starts at +32 kk bytes (K-major:
// inside the swizzled row; the hardware swizzles the sum, as TMA did) or +2048 kk (MN-major:
// 16 rows further). Consumer warpgroup w's A (C rows 64 w ..) starts 64 w rows (K-major) or w
// blocks (MN-major) in: 8192 w bytes either way.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ORRERY_GG_LAYOUT __host__ __device__ __forceinline__ constexpr
#else
#define ORRERY_GG_LAYOUT inline constexpr
#endif

namespace orrery::kernels::cuda::grouped_gemm_wgmma {

inline constexpr int kTileM = 128;  // C rows of a tile: 2 consumer warpgroups of 64
// C columns of a tile: kWideTileN (one m64n256k16 per warpgroup and k16) or kNarrowTileN
// (m64n128k16: twice the tiles, for problems of few tiles, where the last round of persistent
// CTAs would leave most SMs idle).
inline constexpr int kWideTileN = 256, kNarrowTileN = 128;
inline constexpr int kTileK = 64;  // the reduction per stage: one 128-byte swizzle row of bf16
inline constexpr int kWgmmaK = 16;
inline constexpr int kSwizzleRowBytes = 128;
inline constexpr int kSwizzleAtomBytes = 1024;                   // 8 rows: the swizzle's period
inline constexpr int kMnBlock = kSwizzleRowBytes / 2;            // 64 bf16 of mn per MN-major box
inline constexpr int kMnBlockBytes = kTileK * kSwizzleRowBytes;  // one MN-major box: 8192
inline constexpr int kStageABytes = kTileM * kTileK * 2;         // 16384
ORRERY_GG_LAYOUT int StageBBytes(int tile_n) { return tile_n * kTileK * 2; }  // 32 or 16 KB
ORRERY_GG_LAYOUT int StageBytes(int tile_n) { return kStageABytes + StageBBytes(tile_n); }
// f32 accumulators per thread of a m64n(tile_n) result.
ORRERY_GG_LAYOUT int AccRegs(int tile_n) { return tile_n / 2; }

static_assert(kStageABytes % kSwizzleAtomBytes == 0, "B's tile starts 1024-byte aligned");
static_assert(StageBytes(kWideTileN) % kSwizzleAtomBytes == 0 &&
                  StageBytes(kNarrowTileN) % kSwizzleAtomBytes == 0,
              "every stage starts 1024-byte aligned");

// The 128-byte swizzle on a byte offset from a 1024-byte aligned start (TMA's
// CU_TENSOR_MAP_SWIZZLE_128B and wgmma's layout type 1): chunk bits 4-6 ^= row bits 7-9.
ORRERY_GG_LAYOUT uint32_t Swizzle128(uint32_t offset) {
  return offset ^ (((offset >> 7) & 7u) << 4);
}

// Where the TMA boxes of a stage put logical element (mn, k) of an operand tile (k < kTileK).
ORRERY_GG_LAYOUT uint32_t TmaElementOffset(bool mn_major, int mn, int k) {
  return mn_major ? Swizzle128(static_cast<uint32_t>((mn / kMnBlock) * kMnBlockBytes +
                                                     k * kSwizzleRowBytes + (mn % kMnBlock) * 2))
                  : Swizzle128(static_cast<uint32_t>(mn * kSwizzleRowBytes + k * 2));
}

// The descriptor fields the kernel uses for the operand part at mn offset mn0 (64 w for A of
// warpgroup w, 0 for B) in k16 step kk of a stage, relative to the tile's start.
ORRERY_GG_LAYOUT uint32_t DescriptorStart(bool mn_major, int mn0, int kk) {
  return mn_major ? static_cast<uint32_t>((mn0 / kMnBlock) * kMnBlockBytes +
                                          kk * kWgmmaK * kSwizzleRowBytes)
                  : static_cast<uint32_t>(mn0 * kSwizzleRowBytes + kk * kWgmmaK * 2);
}
ORRERY_GG_LAYOUT uint32_t DescriptorLbo(bool mn_major) {
  return mn_major ? kMnBlockBytes : 16;  // K-major: unused under the 128-byte swizzle (16 = 1)
}
ORRERY_GG_LAYOUT uint32_t DescriptorSbo() { return kSwizzleAtomBytes; }

// The 64-bit wgmma matrix descriptor: start address >> 4 in bits 0-13, LBO >> 4 in 16-29, SBO >> 4
// in 32-45, base offset 0 (bits 49-51: every tile is 1024-byte aligned), layout type 1 (the
// 128-byte swizzle) in bits 62-63. smem_addr is a shared-window address (< 256 KB).
ORRERY_GG_LAYOUT uint64_t MakeDescriptor(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4) |
         (static_cast<uint64_t>((lbo & 0x3FFFFu) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFFu) >> 4) << 32) | (uint64_t{1} << 62);
}

// The byte offset (from the tile's start) that wgmma reads for element (mn, k) (k < 16) of the
// operand described by `desc` (its start relative to the tile), per the canonical layouts above.
ORRERY_GG_LAYOUT uint32_t WgmmaElementOffset(uint64_t desc, bool mn_major, int mn, int k) {
  const uint32_t start = static_cast<uint32_t>(desc & 0x3FFFu) << 4;
  const uint32_t lbo = static_cast<uint32_t>((desc >> 16) & 0x3FFFu) << 4;
  const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3FFFu) << 4;
  const uint32_t mnu = static_cast<uint32_t>(mn), ku = static_cast<uint32_t>(k);
  return mn_major ? Swizzle128(start + 2 * (mnu % 64) + lbo * (mnu / 64) + 128 * (ku % 8) +
                               sbo * (ku / 8))
                  : Swizzle128(start + 128 * (mnu % 8) + sbo * (mnu / 8) + 2 * ku);
}

// The wgmma m64nNk16 f32 accumulators of thread `tid` (0..127 of its warpgroup): register r holds
// row 16 (tid / 32) + (tid % 32) / 4 + 8 ((r / 2) % 2), column 8 (r / 4) + 2 (tid % 4) + r % 2.
ORRERY_GG_LAYOUT int AccRow(int tid, int r) {
  return 16 * (tid / 32) + (tid % 32) / 4 + 8 * ((r / 2) % 2);
}
ORRERY_GG_LAYOUT int AccCol(int tid, int r) { return 8 * (r / 4) + 2 * (tid % 4) + r % 2; }

// The tile schedule. Tiles are numbered expert by expert; a persistent CTA takes tiles blockIdx.x,
// + gridDim.x, ... and finds each one's expert by a running prefix over the experts' tile counts.
//   Row products (forward, input grad): an expert of `rows` rows has ceil(rows / kTileM) row
//     tiles times tiles_n column tiles, column tile fastest.
//   Weight grad: an expert with rows has tiles_m x tiles_n tiles of dW_e (column fastest), each
//     reducing over all its rows; an expert without rows has none (its dW_e is left alone).
ORRERY_GG_LAYOUT int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
ORRERY_GG_LAYOUT int64_t ExpertTiles(bool weight_grad, int64_t rows, int64_t tiles_m,
                                     int64_t tiles_n) {
  return weight_grad ? (rows > 0 ? tiles_m * tiles_n : 0) : CeilDiv(rows, kTileM) * tiles_n;
}

// Where tile `local` of an expert with rows [lo, hi) lies: its C rows from c_row0 (row products:
// global rows, masked at hi; weight grad: rows of dW_e), C columns from c_col0 (tiles of col_tile
// columns: tile_n, or half of it for the fused GLU, whose B holds the gate's and the up's rows),
// and its stages (row products: row_k_tiles, the same for every tile; weight grad: the expert's
// rows / kTileK).
struct TilePlace {
  int64_t c_row0, c_col0, k_tiles;
};
ORRERY_GG_LAYOUT TilePlace PlaceTile(bool weight_grad, int64_t local, int64_t lo, int64_t hi,
                                     int64_t tiles_n, int64_t row_k_tiles, int col_tile) {
  return weight_grad ? TilePlace{(local / tiles_n) * kTileM, (local % tiles_n) * col_tile,
                                 CeilDiv(hi - lo, kTileK)}
                     : TilePlace{lo + (local / tiles_n) * kTileM, (local % tiles_n) * col_tile,
                                 row_k_tiles};
}

// ---- what the producer loads into a stage ----

// The products (kGlu: the forward of the stacked gate W1 and up W3 with the GLU in the epilogue).
enum class Product { kForward, kInputGrad, kWeightGrad, kGlu };

ORRERY_GG_LAYOUT bool AMnMajor(Product p) { return p == Product::kWeightGrad; }
ORRERY_GG_LAYOUT bool BMnMajor(Product p) {
  return p == Product::kInputGrad || p == Product::kWeightGrad;
}
// C columns a tile covers: the GLU's B holds 128 rows of W1_e and the same 128 of W3_e.
ORRERY_GG_LAYOUT int ColTile(Product p, int tile_n) {
  return p == Product::kGlu ? tile_n / 2 : tile_n;
}

// A launch's sizes (the kernel's parameter).
struct GemmShape {
  int num_experts;
  int64_t m;        // rows of the row-major operands
  int64_t tiles_m;  // weight grad: C row tiles (over N)
  int64_t tiles_n;  // C column tiles (of ColTile columns)
  int64_t k_tiles;  // row products: stages of a tile (the weight grad's depend on the expert)
  int64_t n_out;    // C columns (N forward and GLU (F); K input and weight grad)
  int64_t c_rows;   // weight grad: C rows (N)
  int tile_n;       // kWideTileN or kNarrowTileN
};

// A product's tensor maps: kMapA (the row operand: X or dY), kMapB (W, or X for the weight grad),
// kMapB2 (the GLU's W3). Their TMA boxes, [outer][inner] elements with 128-byte inner rows:
//   A, row products: [kTileM rows][kTileK]     (K-major, 2-D over [M, K or N])
//   A, weight grad:  [kTileK rows][kMnBlock]   (MN-major, 2-D over dY [M, N])
//   B, forward:      [tile_n rows of N][kTileK] (K-major, 3-D over W [E, N, K], box depth 1)
//   B, B2, GLU:      [tile_n / 2 rows of F][kTileK]
//   B, input grad:   [kTileK rows of N][kMnBlock] (MN-major, 3-D over W)
//   B, weight grad:  [kTileK rows][kMnBlock]   (MN-major, 2-D over X [M, K])
inline constexpr int kMapA = 0, kMapB = 1, kMapB2 = 2;
struct BoxExtent {
  int inner, outer;
};
ORRERY_GG_LAYOUT BoxExtent MapBox(Product p, int map, int tile_n) {
  if (map == kMapA) {
    return p == Product::kWeightGrad ? BoxExtent{kMnBlock, kTileK} : BoxExtent{kTileK, kTileM};
  }
  if (p == Product::kForward) return BoxExtent{kTileK, tile_n};
  if (p == Product::kGlu) return BoxExtent{kTileK, tile_n / 2};
  return BoxExtent{kMnBlock, kTileK};
}
ORRERY_GG_LAYOUT bool MapIs3d(Product p, int map) {
  return map != kMapA && p != Product::kWeightGrad;  // W [E, N, K] (or W1, W3 [E, F, K])
}

// One TMA box of a stage: which map, where in the stage (bytes), its coordinates innermost first
// (c2: the expert, for 3-D maps).
struct Box {
  int map;
  uint32_t smem;
  int c0, c1, c2;
};

// The MN-major boxes of 64 a tile loads from mn0 on: those that start inside the extent, at most
// the tile's (a box wholly past the tensor's edge is not loaded: only C past the edge reads it).
ORRERY_GG_LAYOUT int BoxesInside(int64_t extent, int64_t mn0, int tile) {
  const int64_t n = CeilDiv(extent - mn0, kMnBlock);
  return static_cast<int>(n < tile / kMnBlock ? n : tile / kMnBlock);
}

// The boxes of stage kt of a tile of `expert` (rows from lo) at place pl: BoxCount of them, box
// i by BoxAt. Row products: A from the tile's first row; B at the tile's columns (forward, GLU:
// W rows; input grad: a box per 64 of dX's columns inside K, rows = the stage's 64 of N). Weight
// grad: a box per 64 of dW's rows inside N (A, dY) and per 64 of its columns inside K (B, X), all
// at the expert's rows lo + 64 kt.
ORRERY_GG_LAYOUT int BoxCount(Product p, const GemmShape& s, const TilePlace& pl) {
  switch (p) {
    case Product::kForward:
      return 2;
    case Product::kGlu:
      return 3;
    case Product::kInputGrad:
      return 1 + BoxesInside(s.n_out, pl.c_col0, s.tile_n);
    case Product::kWeightGrad:
      return BoxesInside(s.c_rows, pl.c_row0, kTileM) + BoxesInside(s.n_out, pl.c_col0, s.tile_n);
  }
  return 0;
}

ORRERY_GG_LAYOUT Box BoxAt(Product p, const GemmShape& s, int expert, int64_t lo,
                           const TilePlace& pl, int64_t kt, int i) {
  const int k0 = static_cast<int>(kt * kTileK);
  const int row0 = static_cast<int>(pl.c_row0), col0 = static_cast<int>(pl.c_col0);
  const uint32_t b0 = kStageABytes;  // B's tile in the stage
  switch (p) {
    case Product::kForward:
      return i == 0 ? Box{kMapA, 0, k0, row0, 0} : Box{kMapB, b0, k0, col0, expert};
    case Product::kGlu:
      return i == 0   ? Box{kMapA, 0, k0, row0, 0}
             : i == 1 ? Box{kMapB, b0, k0, col0, expert}
                      : Box{kMapB2, b0 + static_cast<uint32_t>(StageBBytes(s.tile_n) / 2), k0, col0,
                            expert};
    case Product::kInputGrad:
      return i == 0 ? Box{kMapA, 0, k0, row0, 0}
                    : Box{kMapB, b0 + static_cast<uint32_t>((i - 1) * kMnBlockBytes),
                          col0 + (i - 1) * kMnBlock, k0, expert};
    case Product::kWeightGrad: {
      const int row = static_cast<int>(lo) + k0;
      const int blocks_a = BoxesInside(s.c_rows, pl.c_row0, kTileM);
      return i < blocks_a
                 ? Box{kMapA, static_cast<uint32_t>(i * kMnBlockBytes), row0 + i * kMnBlock, row, 0}
                 : Box{kMapB, b0 + static_cast<uint32_t>((i - blocks_a) * kMnBlockBytes),
                       col0 + (i - blocks_a) * kMnBlock, row, 0};
    }
  }
  return Box{kMapA, 0, 0, 0, 0};
}

// The bytes a stage's boxes bring (the `full` barrier's transaction count: TMA counts a box's
// zero-filled elements past the tensor's edge too).
ORRERY_GG_LAYOUT uint32_t StageBytes(Product p, const GemmShape& s, const TilePlace& pl) {
  uint32_t bytes = 0;
  for (int i = 0; i < BoxCount(p, s, pl); ++i) {
    const BoxExtent e = MapBox(p, BoxAt(p, s, 0, 0, pl, 0, i).map, s.tile_n);
    bytes += static_cast<uint32_t>(e.inner * e.outer * 2);
  }
  return bytes;
}

// The weight grad's last stage of an expert with `valid` < kTileK rows left: the 16-byte chunk i
// of the stage (MN-major boxes of kTileK rows of 128 bytes) is zeroed when its row is past them.
ORRERY_GG_LAYOUT bool ChunkPastRows(int i, int64_t valid) {
  return (i / (kSwizzleRowBytes / 16)) % kTileK >= valid;
}

// Expert e's rows [lo, hi) from the offsets, clamped into [0, m] as the mma.sync kernel and the
// CPU twin clamp them (bad offsets give wrong sums, never an access outside the tensors).
ORRERY_GG_LAYOUT void ClampRows(int64_t off_lo, int64_t off_hi, int64_t m, int64_t* lo,
                                int64_t* hi) {
  const int64_t a = off_lo < 0 ? 0 : (off_lo > m ? m : off_lo);
  *lo = a;
  *hi = off_hi < a ? a : (off_hi > m ? m : off_hi);
}

}  // namespace orrery::kernels::cuda::grouped_gemm_wgmma
