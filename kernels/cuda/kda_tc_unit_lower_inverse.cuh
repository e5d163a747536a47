// T = (I + A)^-1 for the 64 x 64 strictly lower-triangular A_kk of one chunk (spec §2.4), in
// fp32 shared memory, as the tensor-core forward's chunk preparation forms it
// (kda_forward_tc.cu). Two steps over 16 x 16 blocks:
//
// 1. InvertDiagonalBlock16: one warp per diagonal block, forward substitution with lane j
//    holding column j of the block's inverse in registers and each row of A read as a broadcast,
//    so the 16 steps need no barrier and no shared-memory round trip between them.
// 2. InvertOffDiagonalBlocks: the blocks below the diagonal by distance, level by level,
//    T_ab = -T_aa sum_{b <= c < a} A_ac T_cb, each 16 x 8 half of a block on one warp as tf32
//    MMAs with every fp32 operand split into tf32 hi + lo (hi hi + hi lo + lo hi: fp32-grade
//    products, so T carries no more error than the fp32 substitution it replaces).
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

// The blocks of T below its diagonal, from A (strictly lower) and T's diagonal blocks
// (InvertDiagonalBlock16, visible to every thread). `scratch` holds 6 x 16 x 8 floats. Every
// thread of the block calls it (kThreads >= 192); it ends with a barrier.
template <int kThreads>
__device__ __forceinline__ void InvertOffDiagonalBlocks(const float* a, int sa, float* t, int st,
                                                        float* scratch) {
  static_assert(kThreads >= 6 * 32, "one warp per 16 x 8 half of a level's blocks");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, t4 = lane & 3;
  for (int dist = 1; dist < 4; ++dist) {
    // Warp w: block (bb + dist, bb) with bb = w / 2, columns 8 (w % 2) .. + 7 of it.
    if (warp < 2 * (4 - dist)) {
      const int bb = warp >> 1, ab = bb + dist, n0 = 16 * bb + 8 * (warp & 1);
      uint32_t ah[4], al[4], bh[2], bl[2];
      // S = sum_{bb <= c < ab} A_ac T_c,bb (this warp's 16 x 8), through scratch into B's layout.
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int k0 = 16 * bb; k0 < 16 * ab; k0 += 8) {
        LoadSplitFragATf32(a + 16 * ab * sa + k0, sa, ah, al);
        LoadSplitFragBTf32(t + k0 * st + n0, st, bh, bl);
        MmaTf32Split(acc, ah, al, bh, bl);
      }
      float* s = scratch + warp * 16 * 8;
      s[g8 * 8 + 2 * t4] = acc[0];
      s[g8 * 8 + 2 * t4 + 1] = acc[1];
      s[(g8 + 8) * 8 + 2 * t4] = acc[2];
      s[(g8 + 8) * 8 + 2 * t4 + 1] = acc[3];
      __syncwarp();
      // T_ab (these 8 columns) = -T_aa S.
      float out[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int k0 = 0; k0 < 16; k0 += 8) {
        LoadSplitFragATf32(t + 16 * ab * st + 16 * ab + k0, st, ah, al);
        LoadSplitFragBTf32(s + k0 * 8, 8, bh, bl);
        MmaTf32Split(out, ah, al, bh, bl);
      }
      float* dst = t + (16 * ab + g8) * st + n0 + 2 * t4;
      dst[0] = -out[0];
      dst[1] = -out[1];
      dst[8 * st] = -out[2];
      dst[8 * st + 1] = -out[3];
    }
    __syncthreads();
  }
}

}  // namespace orrery::kernels::cuda
