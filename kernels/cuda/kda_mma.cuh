// Warp-level bf16 tensor-core helpers for the KDA kernels (sm_80+ `mma.sync`, used on sm_90a).
//
// One `mma.sync.m16n8k16` multiplies a 16x16 bf16 tile A (row-major, rows = M) by a 16x8 bf16
// tile B and accumulates into a 16x8 fp32 tile. Lane l of the warp holds, with g = l / 4 and
// t = l % 4 (PTX ISA, "Matrix Fragments for mma.m16n8k16"):
//   A: a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..2t+1], a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..]
//   B: b[0] = B[2t..2t+1][g],  b[1] = B[2t+8..2t+9][g]
//   C: c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..2t+1]
// Each 32-bit register packs two bf16, the lower k (or column) index in the low half.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace orrery::kernels::cuda {

__device__ __forceinline__ void MmaBf16(float (&c)[4], const uint32_t (&a)[4],
                                        const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The tf32 form of `mma.sync.m16n8k8` (fp32 accumulation): 16x8 A by 8x8 B, each 32-bit register
// one tf32 value. Lane l, g = l / 4, t = l % 4: a[0] = A[g][t], a[1] = A[g+8][t], a[2] = A[g][t+4],
// a[3] = A[g+8][t+4]; b[0] = B[t][g], b[1] = B[t+4][g]; c as for the bf16 form above.
__device__ __forceinline__ void MmaTf32(float (&c)[4], const uint32_t (&a)[4],
                                        const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// x as tf32 hi + lo (hi = x rounded to tf32's 10-bit mantissa, lo = the rest rounded again):
// the three products hi hi + hi lo + lo hi of two split operands carry about fp32's precision.
__device__ __forceinline__ void SplitTf32(float x, uint32_t& hi, uint32_t& lo) {
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(hi) : "f"(x));
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(lo) : "f"(x - __uint_as_float(hi)));
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t PackBf16(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  __nv_bfloat162 v;
  v.x = lo;
  v.y = hi;
  return *reinterpret_cast<const uint32_t*>(&v);
}

// x0, x1 as hi + lo with hi = their bf16 rounding and lo = the bf16 rounding of the rest: two MMAs
// on (hi, lo) carry about 16 bits of each value instead of 8.
__device__ __forceinline__ void PackBf16Split(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = PackBf16(x0 - __low2float(h), x1 - __high2float(h));
}

// The two bf16 of a packed register (the low half first), as floats (exact).
__device__ __forceinline__ float2 UnpackBf16x2(uint32_t x) {
  return make_float2(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u));
}

// The `ldmatrix` forms the fragment loaders below use: each lane passes the shared-memory address
// of the 16-byte row it supplies (lanes 8 i .. 8 i + 7 for matrix i; for x2, lanes 0-15), and
// register i receives matrix i's fragment (lane l: row l / 4, elements 2 (l % 4) and + 1; with
// .trans, of the transposed matrix).
__device__ __forceinline__ void LdMatrixX4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                           const __nv_bfloat16* row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                uint32_t& r3, const __nv_bfloat16* row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX2Trans(uint32_t& r0, uint32_t& r1,
                                                const __nv_bfloat16* row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(addr));
}

// A fragment of the 16x16 tile at column k0 of a row-major bf16 matrix (`stride` elements per
// row, even; k0 even), rows 0..15 from `base`.
__device__ __forceinline__ void LoadFragA(uint32_t (&a)[4], const __nv_bfloat16* base, int stride,
                                          int k0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const __nv_bfloat16* p0 = base + g * stride + k0 + 2 * t;
  const __nv_bfloat16* p1 = p0 + 8 * stride;
  a[0] = *reinterpret_cast<const uint32_t*>(p0);
  a[1] = *reinterpret_cast<const uint32_t*>(p1);
  a[2] = *reinterpret_cast<const uint32_t*>(p0 + 8);
  a[3] = *reinterpret_cast<const uint32_t*>(p1 + 8);
}

// LoadFragA in one `ldmatrix.x4`: lane l gives the address of row l % 8 (+ 8 for matrices 1
// and 3) at column k0 (+ 8 for matrices 2 and 3). Rows 16-byte aligned.
__device__ __forceinline__ void LoadFragAx4(uint32_t (&a)[4], const __nv_bfloat16* base, int stride,
                                            int k0) {
  const int lane = threadIdx.x & 31, mat = lane >> 3;
  const __nv_bfloat16* p = base + ((lane & 7) + (mat & 1) * 8) * stride + k0 + (mat >> 1) * 8;
  LdMatrixX4(a[0], a[1], a[2], a[3], p);
}
// LoadFragBT for the two adjacent 16x8 tiles of rows 0..7 (b0) and 8..15 (b1) of `base`, in
// one `ldmatrix.x4`. Rows 16-byte aligned.
__device__ __forceinline__ void LoadFragBT2(uint32_t (&b0)[2], uint32_t (&b1)[2],
                                            const __nv_bfloat16* base, int stride, int k0) {
  const int lane = threadIdx.x & 31, mat = lane >> 3;
  const __nv_bfloat16* p = base + ((lane & 7) + (mat >> 1) * 8) * stride + k0 + (mat & 1) * 8;
  LdMatrixX4(b0[0], b0[1], b1[0], b1[1], p);
}
// A fragment of the 16x16 tile A[row0..row0+15][k0..k0+15] of A = X^T, where X is a row-major
// bf16 matrix in shared memory ([k][row], `stride` elements per row), in one
// `ldmatrix.x4.trans`: 8x8 matrix i covers X rows k0 + 8 (i / 2) and columns row0 + 8 (i % 2),
// lane l gives the address of row l % 8 of matrix l / 8. X's rows must be 16-byte aligned
// (stride a multiple of 8 elements, row0 % 8 == 0).
__device__ __forceinline__ void LoadFragAT(uint32_t (&a)[4], const __nv_bfloat16* base, int stride,
                                           int row0, int k0) {
  const int lane = threadIdx.x & 31, mat = lane >> 3, row = lane & 7;
  const __nv_bfloat16* p = base + (k0 + (mat >> 1) * 8 + row) * stride + row0 + (mat & 1) * 8;
  LdMatrixX4Trans(a[0], a[1], a[2], a[3], p);
}
// Swizzled rows: a row-major bf16 matrix in shared memory, `cols` (a multiple of 64) elements per
// row and no padding, whose 16-byte piece j of row r lies at piece j ^ (r % 8). The 8 rows an
// `ldmatrix` phase reads then fall in 8 different bank groups (what padding the rows by 16 bytes
// does otherwise), and the 16-byte copies of one 128-byte global line fill one 128-byte shared
// line instead of straddling two.
__device__ __forceinline__ int SwizzledOffset(int r, int c, int cols) {
  return r * cols + ((((c >> 3) ^ (r & 7)) << 3) | (c & 7));
}
// LoadFragAT on swizzled rows (row0 % 8 == 0).
__device__ __forceinline__ void LoadFragATSwizzled(uint32_t (&a)[4], const __nv_bfloat16* base,
                                                   int cols, int row0, int k0) {
  const int lane = threadIdx.x & 31, mat = lane >> 3, row = lane & 7;
  const __nv_bfloat16* p =
      base + SwizzledOffset(k0 + (mat >> 1) * 8 + row, row0 + (mat & 1) * 8, cols);
  LdMatrixX4Trans(a[0], a[1], a[2], a[3], p);
}
// B fragment of the 16x8 tile B[k0..k0+15][0..7] where B is stored transposed ("col"): row n of
// `base` holds B[.][n] along k (`stride` elements per row).
__device__ __forceinline__ void LoadFragBT(uint32_t (&b)[2], const __nv_bfloat16* base, int stride,
                                           int k0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const __nv_bfloat16* p = base + g * stride + k0 + 2 * t;
  b[0] = *reinterpret_cast<const uint32_t*>(p);
  b[1] = *reinterpret_cast<const uint32_t*>(p + 8);
}

// B fragment of the 16x8 tile B[k0..k0+15][n0..n0+7] of a row-major B ([k][n] in shared memory,
// `stride` elements per row), in one `ldmatrix.x2.trans` (lanes 0-15 give the row addresses).
// Rows must be 16-byte aligned (stride a multiple of 8 elements, n0 % 8 == 0).
__device__ __forceinline__ void LoadFragB(uint32_t (&b)[2], const __nv_bfloat16* base, int stride,
                                          int k0, int n0) {
  const int lane = threadIdx.x & 15;
  const __nv_bfloat16* p = base + (k0 + lane) * stride + n0;
  LdMatrixX2Trans(b[0], b[1], p);
}
// LoadFragB on swizzled rows (n0 % 8 == 0).
__device__ __forceinline__ void LoadFragBSwizzled(uint32_t (&b)[2], const __nv_bfloat16* base,
                                                  int cols, int k0, int n0) {
  const int lane = threadIdx.x & 15;
  const __nv_bfloat16* p = base + SwizzledOffset(k0 + lane, n0, cols);
  LdMatrixX2Trans(b[0], b[1], p);
}
// B fragments of the two adjacent 16x8 tiles B[k0..k0+15][n0..n0+7] (b0) and
// B[k0..k0+15][n0+8..n0+15] (b1) of a row-major B ([k][n] in shared memory, `stride` elements per
// row), in one `ldmatrix.x4.trans`: lane l gives the address of row l % 8 of 8x8 matrix l / 8
// (matrices: k0 | k0 + 8 rows, then the same at n0 + 8). Rows must be 16-byte aligned (stride a
// multiple of 8 elements, n0 % 8 == 0).
__device__ __forceinline__ void LoadFragB2(uint32_t (&b0)[2], uint32_t (&b1)[2],
                                           const __nv_bfloat16* base, int stride, int k0, int n0) {
  const int lane = threadIdx.x & 31, mat = lane >> 3, row = lane & 7;
  const __nv_bfloat16* p = base + (k0 + (mat & 1) * 8 + row) * stride + n0 + (mat >> 1) * 8;
  LdMatrixX4Trans(b0[0], b0[1], b1[0], b1[1], p);
}
// The 16x16 tile held as two m16n8 fp32 accumulators (c0: columns 0-7, c1: columns 8-15), rounded
// to bf16 and stored transposed, dst[col * stride + row], in one `stmatrix.x4.trans`: its four
// 8x8 matrices are (rows 0-7 | 8-15) x (columns 0-7 | 8-15), and lane l gives the address of
// stored row l % 8 (a column of the tile) of matrix l / 8. dst 16-byte aligned, stride a multiple
// of 8 elements.
__device__ __forceinline__ void StoreTileTransposedBf16(const float (&c0)[4], const float (&c1)[4],
                                                        __nv_bfloat16* dst, int stride) {
  const int lane = threadIdx.x & 31, mat = lane >> 3, row = lane & 7;
  const __nv_bfloat16* p = dst + ((mat >> 1) * 8 + row) * stride + (mat & 1) * 8;
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr),
               "r"(PackBf16(c0[0], c0[1])), "r"(PackBf16(c0[2], c0[3])),
               "r"(PackBf16(c1[0], c1[1])), "r"(PackBf16(c1[2], c1[3]))
               : "memory");
}

// kRows rows of kCols bf16 from shared memory (row stride src_ld, rows 16-byte aligned) to rows
// of global memory (row stride dst_ld), by kThreads threads (`thread`: this one's index among
// them), 16 bytes each per step: whole rows per quarter-warp, so that every store fills its
// 32-byte sectors (an accumulator's own 4-byte stores fill half of each).
template <int kRows, int kCols, int kThreads>
__device__ __forceinline__ void CopyRowsToGlobal(const __nv_bfloat16* src, int src_ld,
                                                 __nv_bfloat16* dst, int dst_ld, int thread) {
  constexpr int kPieces = kCols / 8;
#pragma unroll
  for (int i = thread; i < kRows * kPieces; i += kThreads) {
    const int r = i / kPieces, c = (i % kPieces) * 8;
    *reinterpret_cast<uint4*>(dst + r * dst_ld + c) =
        *reinterpret_cast<const uint4*>(src + r * src_ld + c);
  }
}

// 16-byte global -> shared copy that bypasses the registers (and L1).
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}

// A [kRows][kCols] bf16 tile from global rows (row stride src_ld) into shared rows (row stride
// dst_ld, 16-byte aligned) as 16-byte `cp.async` pieces, by kThreads threads (`thread`: this one's
// index among them); rows from valid_rows on are zero-filled instead. Each thread keeps one column
// piece and steps its two pointers by whole rows, a few instructions a copy (an index divided into
// row and column per piece cost ~25).
template <int kRows, int kCols, int kThreads>
__device__ __forceinline__ void CopyTileToShared(__nv_bfloat16* dst, int dst_ld,
                                                 const __nv_bfloat16* src, int64_t src_ld,
                                                 int thread, int valid_rows = kRows) {
  constexpr int kPieces = kCols / 8;
  static_assert(kThreads % kPieces == 0, "a thread's pieces share their column");
  constexpr int kRowStep = kThreads / kPieces;
  static_assert(kRows % kRowStep == 0, "every thread the same number of pieces");
  const int c = (thread % kPieces) * 8, r0 = thread / kPieces;
  const __nv_bfloat16* s = src + r0 * src_ld + c;
  __nv_bfloat16* d = dst + r0 * dst_ld + c;
#pragma unroll
  for (int it = 0; it < kRows / kRowStep; ++it) {
    if (r0 + it * kRowStep < valid_rows) {
      CpAsync16(d, s);
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
    s += kRowStep * src_ld;
    d += kRowStep * dst_ld;
  }
}

__device__ __forceinline__ void CpAsyncWaitAll() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}
// Closes the group of copies issued since the last commit (a pipeline stage).
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most `kPending` committed groups are still in flight (the latest ones).
template <int kPending>
__device__ __forceinline__ void CpAsyncWaitPending() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace orrery::kernels::cuda
