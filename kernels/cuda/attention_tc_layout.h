// The index arithmetic of the tensor-core attention kernels' shared-memory tiles and ldmatrix
// fragment loads (attention_tc_tiles.cuh), as plain constexpr functions that host code can run
// too: tests/unit/kernels/attention_tc_layout_test.cc checks them against the PTX definitions of
// ldmatrix and mma.m16n8k16 on a simulated warp, without a GPU.
//
// A tile holds rows of `cols` bf16 (cols a multiple of 64), no padding, 128-byte aligned; the
// 16-byte piece j of row r lies at piece j ^ (r % 8), so the 8 rows an ldmatrix phase reads at
// one column piece sit in 8 different bank groups.
//
// ldmatrix.x4 reads four 8x8 matrices; lane l gives the address of row l % 8 of matrix i = l / 8,
// which sits 8 sel_r(i) rows and sel_p(i) pieces past the fragment's corner (row0, col0), with
// row0 % 8 == 0 and col0 % 16 == 0. The byte offset of that piece,
//   R cols 2 + 16 ((col0 / 8 + sel_p) ^ (R % 8)),   R = row0 + l % 8 + 8 sel_r,
// splits into a per-lane part and per-fragment constants: R % 8 = l % 8 and col0 / 8 even give
//   (lane ^ 16 (col0 / 8 % 8)) + row0 cols 2 + 16 (col0 / 8 - col0 / 8 % 8),
//   lane = tile + (l % 8 + 8 sel_r) cols 2 + 16 (sel_p ^ l % 8)
// (the XOR touches address bits 4-6 only, which the added multiples of 128 leave alone). A
// fragment load then costs one XOR of a per-lane base and an immediate offset.
//
// Orders of the four matrices (g = lane / 4, t = lane % 4 for the registers received):
//   row order (sel_r = i % 2, sel_p = i / 2): (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15),
//     (8-15, 8-15). On a [m][k] tile: the A fragment a[0] = A[g][2t..], a[1] = A[g+8][2t..],
//     a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..]. With .trans on a [k][n] tile: lane l gets
//     X[2t..][g] of each matrix, the B fragments b[0] = B[2t..][g], b[1] = B[2t+8..][g] of the
//     n-tile n0 (registers 0, 1) and of n0 + 8 (registers 2, 3).
//   column order (sel_r = i / 2, sel_p = i % 2): (0-7, 0-7), (0-7, 8-15), (8-15, 0-7),
//     (8-15, 8-15). On an [n][k] tile without .trans: lane l gets X[n = g][k = 2t..], the "col"
//     B fragments of B = X^T for n-tiles n0 (registers 0, 1) and n0 + 8 (registers 2, 3).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ORRERY_TC_LAYOUT __host__ __device__ __forceinline__ constexpr
#else
#define ORRERY_TC_LAYOUT inline constexpr
#endif

namespace orrery::kernels::cuda::attention_tc {

// The element offset of (r, c) in a swizzled tile of `cols` columns.
ORRERY_TC_LAYOUT int SwizzledElement(int r, int c, int cols) {
  return r * cols + ((((c >> 3) ^ (r & 7)) << 3) | (c & 7));
}

// The per-lane byte offset from the tile's start (LaneBase in attention_tc_tiles.cuh adds the
// tile's shared address, which must be 128-byte aligned).
ORRERY_TC_LAYOUT uint32_t LaneByteOffset(int lane, int cols, bool row_order) {
  const int mat = lane >> 3, r = lane & 7;
  const int sel_r = row_order ? (mat & 1) : (mat >> 1);
  const int sel_p = row_order ? (mat >> 1) : (mat & 1);
  return static_cast<uint32_t>((r + 8 * sel_r) * cols * 2 + 16 * (sel_p ^ r));
}

// The address this lane gives ldmatrix for the fragment at (row0, col0), from its lane base.
ORRERY_TC_LAYOUT uint32_t FragmentAddress(uint32_t lane_base, int cols, int row0, int col0) {
  const int piece = col0 / 8;
  return (lane_base ^ static_cast<uint32_t>(16 * (piece & 7))) +
         static_cast<uint32_t>(row0 * cols * 2 + 16 * (piece & ~7));
}

// An m16n8 accumulator pair (lo: columns 16 kk .. + 7, hi: + 8 .. + 15) as the A fragment of
// k-step kk of the next product: register i of A packs elements 2 (i % 2), 2 (i % 2) + 1 of
// accumulator i / 2 (c[0..1] at row g, c[2..3] at row g + 8, columns 2t, 2t + 1 of each; the A
// layout above wants (g, 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8)).
ORRERY_TC_LAYOUT int AccumulatorOfA(int reg) { return reg / 2; }
ORRERY_TC_LAYOUT int AccumulatorElementOfA(int reg, int half) { return 2 * (reg % 2) + half; }

}  // namespace orrery::kernels::cuda::attention_tc

#undef ORRERY_TC_LAYOUT
