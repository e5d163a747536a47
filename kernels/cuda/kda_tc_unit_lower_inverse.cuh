// T = (I + A)^-1 for the 64 x 64 strictly lower-triangular A_kk of one chunk (spec §2.4), in
// fp32 shared memory, as the tensor-core forward's chunk preparation forms it
// (kda_forward_tc.cu). Two steps over 16 x 16 blocks:
//
// 1. InvertDiagonalBlock16: one warp per diagonal block, forward substitution with lane j
//    holding column j of the block's inverse in registers and each row of A read as a broadcast,
//    so the 16 steps need no barrier and no shared-memory round trip between them.
// 2. InvertOffDiagonalBlocks: the blocks below the diagonal in two levels, first the three next
//    to the diagonal, T_{b+1,b} = -T_{b+1,b+1} A_{b+1,b} T_bb, then T_20, T_31 and T_30 at once
//    (T_30 from the 32 x 32 form of the corner, -T_BB A_BT T_TT, which needs no T_20), each
//    16 x 8 half of a block on one warp as tf32 MMAs with every fp32 operand split into tf32 hi +
//    lo (hi hi + hi lo + lo hi: fp32-grade products, so T carries no more error than the fp32
//    substitution it replaces). Until 2026-12 the corner took two levels (T_30 after T_20), one
//    barrier and one MMA chain more.
#pragma once

#include <cstdint>

#include "kernels/cuda/kda_mma.cuh"

namespace orrery::kernels::cuda {

// The inverse of the unit lower-triangular diagonal block (I + A_bb), b = base / 16, into
// t[(base + i) * st + base + j] for the whole 16 x 16 block (zeros above its diagonal). One warp
// calls it; lanes 0-15 own the columns (lanes 16-31 compute nothing they store).
__device__ __forceinline__ void InvertDiagonalBlock16(const float* a, int sa, float* t, int st,
                                                      int base) {
  const int lane = threadIdx.x & 31, j = lane & 15;
  // x[i] = delta_ij - sum_{m < i} A[i][m] x[m]: the terms with m < j vanish (x[m] = 0 there).
  float x[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float* row = a + (base + i) * sa + base;
    float acc = i == j ? 1.0f : 0.0f;
#pragma unroll
    for (int m = 0; m < i; ++m) acc = fmaf(-row[m], x[m], acc);
    x[i] = acc;
  }
  if (lane < 16) {
#pragma unroll
    for (int i = 0; i < 16; ++i) t[(base + i) * st + base + j] = x[i];
  }
}

// The split A fragment of the 16 x 8 tile at `tile` (row stride `stride`) for MmaTf32, and the
// split B fragment of the 8 x 8 tile B[k][n] at `tile` (row stride `stride`).
__device__ __forceinline__ void LoadSplitFragATf32(const float* tile, int stride, uint32_t (&hi)[4],
                                                   uint32_t (&lo)[4]) {
  const int lane = threadIdx.x & 31;
  const float* p = tile + (lane >> 2) * stride + (lane & 3);
  SplitTf32(p[0], hi[0], lo[0]);
  SplitTf32(p[8 * stride], hi[1], lo[1]);
  SplitTf32(p[4], hi[2], lo[2]);
  SplitTf32(p[8 * stride + 4], hi[3], lo[3]);
}
__device__ __forceinline__ void LoadSplitFragBTf32(const float* tile, int stride, uint32_t (&hi)[2],
                                                   uint32_t (&lo)[2]) {
  const int lane = threadIdx.x & 31;
  const float* p = tile + (lane & 3) * stride + (lane >> 2);
  SplitTf32(p[0], hi[0], lo[0]);
  SplitTf32(p[4 * stride], hi[1], lo[1]);
}
// c += A B with both split: the small products first, lo lo dropped (below fp32's rounding).
__device__ __forceinline__ void MmaTf32Split(float (&c)[4], const uint32_t (&ah)[4],
                                             const uint32_t (&al)[4], const uint32_t (&bh)[2],
                                             const uint32_t (&bl)[2]) {
  MmaTf32(c, al, bh);
  MmaTf32(c, ah, bl);
  MmaTf32(c, ah, bh);
}

// Floats of the scratch InvertOffDiagonalBlocks takes: one 16 x 8 tile per warp of its second
// level's 8 tiles.
constexpr int kInverseScratchFloats = 8 * 16 * 8;

// One warp's 16 x 8 tile S = sum_{k0 <= c < k1} A[row0 + .][c] T[c][n0 + .] (fp32-grade, split
// tf32) into `s` (16 x 8, row-major), through which it reaches the B operand's layout.
__device__ __forceinline__ void StoreSplitProductTf32(const float* a, int sa, const float* t,
                                                      int st, int row0, int n0, int k0, int k1,
                                                      float* s) {
  const int lane = threadIdx.x & 31, g8 = lane >> 2, t4 = lane & 3;
  uint32_t ah[4], al[4], bh[2], bl[2];
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int k = k0; k < k1; k += 8) {
    LoadSplitFragATf32(a + row0 * sa + k, sa, ah, al);
    LoadSplitFragBTf32(t + k * st + n0, st, bh, bl);
    MmaTf32Split(acc, ah, al, bh, bl);
  }
  s[g8 * 8 + 2 * t4] = acc[0];
  s[g8 * 8 + 2 * t4 + 1] = acc[1];
  s[(g8 + 8) * 8 + 2 * t4] = acc[2];
  s[(g8 + 8) * 8 + 2 * t4 + 1] = acc[3];
  __syncwarp();
}

// out -= T[row0 + .][c0 .. c0 + 15] S for a 16 x 8 tile S in `s` (as StoreSplitProductTf32 left
// it): fp32-grade, split tf32.
__device__ __forceinline__ void SubSplitProductTf32(const float* t, int st, int row0, int c0,
                                                    const float* s, float (&out)[4]) {
  uint32_t ah[4], al[4], bh[2], bl[2];
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int k0 = 0; k0 < 16; k0 += 8) {
    LoadSplitFragATf32(t + row0 * st + c0 + k0, st, ah, al);
    LoadSplitFragBTf32(s + k0 * 8, 8, bh, bl);
    MmaTf32Split(acc, ah, al, bh, bl);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) out[e] -= acc[e];
}

// The blocks of T below its diagonal, from A (strictly lower) and T's diagonal blocks
// (InvertDiagonalBlock16, visible to every thread). `scratch` holds kInverseScratchFloats
// floats. Every thread of the block calls it (kThreads >= 256); it ends with a barrier.
template <int kThreads>
__device__ __forceinline__ void InvertOffDiagonalBlocks(const float* a, int sa, float* t, int st,
                                                        float* scratch) {
  static_assert(kThreads >= 8 * 32, "one warp per 16 x 8 half of the second level's blocks");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, t4 = lane & 3;
  const int n_half = 8 * (warp & 1);
  float* s = scratch + warp * 16 * 8;
  float out[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  auto store = [&](int row0, int col0) {
    float* dst = t + (row0 + g8) * st + col0 + 2 * t4;
    dst[0] = out[0];
    dst[1] = out[1];
    dst[8 * st] = out[2];
    dst[8 * st + 1] = out[3];
  };
  // Level 1, warps 0-5: T_{b+1,b} = -T_{b+1,b+1} (A_{b+1,b} T_bb), b = warp / 2.
  if (warp < 6) {
    const int b = warp >> 1;
    StoreSplitProductTf32(a, sa, t, st, 16 * (b + 1), 16 * b + n_half, 16 * b, 16 * (b + 1), s);
    SubSplitProductTf32(t, st, 16 * (b + 1), 16 * (b + 1), s, out);
    store(16 * (b + 1), 16 * b + n_half);
  }
  __syncthreads();
  // Level 2, the lower-left corner (rows 32-63, columns 0-31), each tile on its own warps:
  // T_20 = -T_22 (A_20 T_00 + A_21 T_10) on warps 0-1, T_31 = -T_33 (A_31 T_11 + A_32 T_21) on
  // warps 2-3, and T_30 = -(T_32 Y_20 + T_33 Y_30) with Y_a0 = A_a0 T_00 + A_a1 T_10 (the corner
  // as -T_BB (A_BT T_TT), so that it needs no T_20) on warps 4-5, with Y_30 from warps 6-7.
  out[0] = out[1] = out[2] = out[3] = 0.0f;
  if (warp < 2) {
    StoreSplitProductTf32(a, sa, t, st, 32, n_half, 0, 32, s);
    SubSplitProductTf32(t, st, 32, 32, s, out);
    store(32, n_half);
  } else if (warp < 4) {
    StoreSplitProductTf32(a, sa, t, st, 48, 16 + n_half, 16, 48, s);
    SubSplitProductTf32(t, st, 48, 48, s, out);
    store(48, 16 + n_half);
  } else if (warp < 8) {
    StoreSplitProductTf32(a, sa, t, st, warp < 6 ? 32 : 48, n_half, 0, 32, s);  // Y_20 | Y_30
    asm volatile("bar.sync 1, 128;\n" ::: "memory");  // warps 4-7: Y_30 is in scratch
    if (warp < 6) {
      SubSplitProductTf32(t, st, 48, 32, s, out);
      SubSplitProductTf32(t, st, 48, 48, s + 2 * 16 * 8, out);
      store(48, n_half);
    }
  }
  __syncthreads();
}

}  // namespace orrery::kernels::cuda
