// Shared pieces of the tensor-core causal attention kernels (attention_forward_tc.cu,
// attention_backward_tc.cu): the block shape, swizzled bf16 tiles in shared memory filled by
// cp.async, and the ldmatrix fragment loaders on them for `mma.sync.m16n8k16`. The index
// arithmetic and the fragment layouts are in attention_tc_layout.h (g = lane / 4, t = lane % 4).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/attention_tc_layout.h"
#include "kernels/cuda/kda_mma.cuh"

namespace orrery::kernels::cuda::attention_tc {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 4, kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 16;                   // one m16 fragment row block per warp
constexpr int kBlockRows = kWarps * kRowsPerWarp;  // the rows a block owns (64)
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// Rows row0 .. row0 + kRows - 1 of head h of x [n, heads, kDim] (token stride `stride` elements)
// into the swizzled tile dst, as 16-byte cp.async copies by the block's kThreads threads; rows at
// or past n are zero-filled with plain stores (visible after the barrier that follows the wait).
template <int kRows, int kDim>
__device__ __forceinline__ void LoadTileAsync(bf16* dst, const bf16* __restrict__ x, int64_t row0,
                                              int64_t n, int64_t stride, int h) {
  static_assert(kDim % 64 == 0, "swizzled rows are whole 128-byte lines");
  constexpr int kPieces = kDim / 8;
  static_assert(kRows * kPieces % kThreads == 0, "every thread the same number of copies");
#pragma unroll
  for (int it = 0; it < kRows * kPieces / kThreads; ++it) {
    const int idx = static_cast<int>(threadIdx.x) + it * kThreads;
    const int r = idx / kPieces, c = (idx % kPieces) * 8;
    bf16* d = dst + SwizzledElement(r, c, kDim);
    const int64_t row = row0 + r;
    if (row < n) {
      CpAsync16(d, x + row * stride + static_cast<int64_t>(h) * kDim + c);
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  }
}

// This lane's ldmatrix base address on `tile` (shared, 128-byte aligned) for fragments in row or
// column order (attention_tc_layout.h).
__device__ __forceinline__ uint32_t LaneBase(const bf16* tile, int cols, bool row_order) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(tile)) +
         LaneByteOffset(static_cast<int>(threadIdx.x & 31), cols, row_order);
}
__device__ __forceinline__ void LdMatrixX4At(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4TransAt(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// A fragment of the 16x16 tile A[row0..+15][k0..+15] of the swizzled [row][k] tile whose
// row-order LaneBase is `lane_base`: register i is 8x8 matrix i (row order), a[0..3] of the A
// layout.
__device__ __forceinline__ void LoadFragA(uint32_t (&a)[4], uint32_t lane_base, int cols, int row0,
                                          int k0) {
  LdMatrixX4At(a, FragmentAddress(lane_base, cols, row0, k0));
}

// B fragments of B = X^T for the swizzled tile X [n][k] (column-order LaneBase): the two 16x8
// tiles B[k0..+15][n0..+7] (b[0..1]) and B[k0..+15][n0+8..+15] (b[2..3]), no .trans: matrix i
// covers X rows n0 + 8 (i / 2), columns k0 + 8 (i % 2), and lane l receives
// X[n0 + 8 (i / 2) + g][k0 + 8 (i % 2) + 2t ..] = B[k0 + 8 (i % 2) + 2t ..][n = g]: the mma B
// layout (b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g]) of n-tile i / 2.
__device__ __forceinline__ void LoadFragBT2(uint32_t (&b)[4], uint32_t lane_base, int cols, int n0,
                                            int k0) {
  LdMatrixX4At(b, FragmentAddress(lane_base, cols, n0, k0));
}

// B fragments of B = X for the swizzled tile X [k][n] (row-order LaneBase), the same two 16x8
// tiles as LoadFragBT2, by ldmatrix.x4.trans: matrix i covers X rows k0 + 8 (i % 2), columns
// n0 + 8 (i / 2); transposed, lane l receives X[k0 + 8 (i % 2) + 2t ..][n0 + 8 (i / 2) + g] =
// B[8 (i % 2) + 2t ..][g] of n-tile i / 2: b[0..1] for columns n0.., b[2..3] for n0 + 8...
__device__ __forceinline__ void LoadFragB2(uint32_t (&b)[4], uint32_t lane_base, int cols, int k0,
                                           int n0) {
  LdMatrixX4TransAt(b, FragmentAddress(lane_base, cols, k0, n0));
}

// The mma with the first (b[0..1]) or second (b[2..3]) B fragment of a LoadFragBT2/B2 pair.
__device__ __forceinline__ void MmaPair(float (&c0)[4], float (&c1)[4], const uint32_t (&a)[4],
                                        const uint32_t (&b)[4]) {
  const uint32_t lo[2] = {b[0], b[1]}, hi[2] = {b[2], b[3]};
  MmaBf16(c0, a, lo);
  MmaBf16(c1, a, hi);
}

// The A fragment for k-step kk (columns 16 kk .. 16 kk + 15) of a 16 x (8 m) matrix held as m16n8
// accumulators c[0..m): c[j] covers columns 8 j .. 8 j + 7 with c[j][0..1] at (g, 8 j + 2t ..) and
// c[j][2..3] at (g + 8, 8 j + 2t ..). So a[0] = (g, 16 kk + 2t) = c[2kk][0..1], a[1] = (g + 8,
// same) = c[2kk][2..3], a[2] = (g, 16 kk + 8 + 2t) = c[2kk+1][0..1], a[3] = c[2kk+1][2..3]: the
// accumulator of one product is the A operand of the next without leaving the registers.
__device__ __forceinline__ void AccumulatorsAsA(uint32_t (&a)[4], const float (&lo)[4],
                                                const float (&hi)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float(&c)[4] = AccumulatorOfA(i) == 0 ? lo : hi;
    a[i] = PackBf16(c[AccumulatorElementOfA(i, 0)], c[AccumulatorElementOfA(i, 1)]);
  }
}

}  // namespace orrery::kernels::cuda::attention_tc
