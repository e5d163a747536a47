// The grouped GEMMs of kernels/grouped_gemm.h on the tensor cores: one kernel, three operand
// layouts. The fallback of the wgmma/TMA kernel (grouped_gemm_wgmma.cu): devices other than
// compute capability 9.0, and ORRERY_GROUPED_GEMM=mma. Every product is C[i][j] = sum_k A(i, k)
// B(k, j) over a 128 x 128 tile of C per CTA:
//
//   product      i (C row)      j (C col)   k (sum)        A(i, k)           B(k, j)
//   forward      expert row r   n < N       K              X[r][k]  i-major   W_e[j][k] j-major
//   input grad   expert row r   k' < K      n < N          dY[r][n] i-major   W_e[n][k'] k-major
//   weight grad  n < N          k' < K      expert row r   dY[r][i] k-major   X[r][j]  k-major
//
// "i-major" A: shared tile [128 i][32 k] (a row of the tile is a row of the global matrix);
// "k-major" A: shared tile [32 k][128 i]; B alike with j. Rows of every shared tile are padded by
// 8 bf16 (16 bytes), so the 8 rows an ldmatrix phase reads start in 8 different 16-byte bank
// groups (row pitch 80 or 272 bytes: 80 r mod 128 and 272 r mod 128 = 16 r mod 128 are distinct
// for r = 0..7).
//
// 8 warps, 2 (i) x 4 (j), each a 64 x 32 piece: 4 x 4 mma.sync.m16n8k16 tiles, 64 f32 sums per
// lane. K-steps of 32 staged by cp.async in a 3-stage pipeline (60 KB of shared memory). Two CTAs
// per SM (__launch_bounds__ min 2: ptxas fits the kernels in 128 registers without spills; with 1
// they took 150-156), so that one CTA's loads overlap the other's MMAs. Fragments (kernels/cuda/
// kda_mma.cuh; g = lane / 4, t = lane % 4):
//   i-major A: LoadFragAx4 (ldmatrix.x4; matrices rows 0-7 | 8-15 x k 0-7 | 8-15 give a[0..3] =
//              A[g][2t], A[g+8][2t], A[g][2t+8], A[g+8][2t+8]).
//   k-major A: LoadFragAT (ldmatrix.x4.trans of the [k][i] tile; matrix m covers k 8 (m / 2),
//              i 8 (m % 2); transposed, lane l gets i = l / 4, k = 2 (l % 4): the same a[0..3]).
//   j-major B: LoadFragBT2 (ldmatrix.x4 of the [j][k] tile; matrices j 0-7 | 8-15 (m / 2) x
//              k 0-7 | 8-15 (m % 2): lane gets row j = g, k = 2t: b[0] = B[2t][g], b[1] =
//              B[2t+8][g] for the n8 tiles j0 and j0 + 8).
//   k-major B: LoadFragB2 (ldmatrix.x4.trans of the [k][j] tile; matrices k 8 (m % 2), j 8 (m / 2):
//              the same b fragments).
//   C: c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..2t+1].
//
// Tile schedule without the host: for the forward and input grad, CTA x = (i-tile slot) *
// tiles_j + j-tile, with ceil(M / 128) + E slots (an upper bound of sum_e ceil(count_e / 128));
// warp 0 walks the offsets 32 experts a step with a warp prefix sum of the per-expert tile counts
// and finds the slot's (expert, tile); slots past the last tile exit. For the weight grad, CTA
// (x, y) = (tile of dW_e, expert e), reducing over all of the expert's rows (an expert without rows
// exits: dW_e is accumulated). Rows past an expert's end are zero-filled in shared memory (cp.async
// with source size 0: no global read) and never written.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/device_context.h"
#include "kernels/cuda/grouped_gemm_cuda.h"
#include "kernels/cuda/grouped_gemm_store.cuh"
#include "kernels/cuda/kda_mma.cuh"
#include "kernels/grouped_gemm.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kTileI = 128, kTileJ = 128, kStepK = 32, kStages = 3;
constexpr int kWarpsI = 2, kWarpsJ = 4, kThreads = 32 * kWarpsI * kWarpsJ;
constexpr int kWarpI = kTileI / kWarpsI, kWarpJ = kTileJ / kWarpsJ;  // 64 x 32
constexpr int kFragsI = kWarpI / 16, kFragsJ = kWarpJ / 8;           // 4 x 4
constexpr int kPad = 8;
// Elements of one operand's stage: the larger of [128][32 + 8] and [32][128 + 8].
constexpr int kOperandElems = std::max(kTileI * (kStepK + kPad), kStepK*(kTileI + kPad));
constexpr int kSmemBytes = kStages * 2 * kOperandElems * static_cast<int>(sizeof(__nv_bfloat16));
static_assert(kTileI == kTileJ, "the operand stage size covers both tiles");
static_assert(kStepK == 32, "two k16 steps per stage");
// Partial K-steps and tiles are zero-filled by 16-byte pieces: dims need only be multiples of 8.
static_assert(kGroupedGemmDimMultiple == 8, "a dimension is whole 16-byte pieces");

enum class Product { kForward, kInputGrad, kWeightGrad };

// 16 bytes global -> shared through cp.async; with !valid, 16 zero bytes and no global read
// (src-size 0; src must still be a valid address form, the caller passes the tensor's base).
__device__ __forceinline__ void CopyOrZero16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}

// A [kRows][kCols] tile of a row-major global matrix (row stride ld; tile origin at row r0, col
// c0) into shared rows of pitch kCols + kPad. Pieces in rows >= rows or columns >= cols are
// zero-filled (cols is a multiple of 8, so a piece is wholly in or out).
template <int kRows, int kCols>
__device__ __forceinline__ void LoadTile(__nv_bfloat16* dst, const __nv_bfloat16* src, int64_t ld,
                                         int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
  constexpr int kPieces = kCols / 8, kTotal = kRows * kPieces;
  static_assert(kTotal % kThreads == 0, "every thread the same number of pieces");
#pragma unroll
  for (int it = 0; it < kTotal / kThreads; ++it) {
    const int p = it * kThreads + static_cast<int>(threadIdx.x);
    const int r = p / kPieces, c = (p % kPieces) * 8;
    const bool valid = r0 + r < rows && c0 + c < cols;
    const __nv_bfloat16* g = valid ? src + (r0 + r) * ld + c0 + c : src;
    CopyOrZero16(dst + r * (kCols + kPad) + c, g, valid);
  }
}

// The global operands of one CTA's tile (see the table at the top).
struct TileArgs {
  const __nv_bfloat16* a;  // A's matrix (X or dY) at the expert's first row for the weight grad
  const __nv_bfloat16* b;  // B's matrix (W_e, or X at the expert's first row)
  int64_t lda, ldb;
  int64_t i0, i_end;  // C rows [i0, i0 + 128) of A's rows (i-major) or columns (k-major), < i_end
  int64_t j0, j_end;  // C columns, < j_end
  int64_t k_end;      // the reduction's length
};

template <bool kAIMajor, bool kBJMajor>
__device__ __forceinline__ void LoadStage(const TileArgs& t, int64_t k0, __nv_bfloat16* sa,
                                          __nv_bfloat16* sb) {
  if constexpr (kAIMajor) {
    LoadTile<kTileI, kStepK>(sa, t.a, t.lda, t.i0, t.i_end, k0, t.k_end);
  } else {
    LoadTile<kStepK, kTileI>(sa, t.a, t.lda, k0, t.k_end, t.i0, t.i_end);
  }
  if constexpr (kBJMajor) {
    LoadTile<kTileJ, kStepK>(sb, t.b, t.ldb, t.j0, t.j_end, k0, t.k_end);
  } else {
    LoadTile<kStepK, kTileJ>(sb, t.b, t.ldb, k0, t.k_end, t.j0, t.j_end);
  }
}

// acc += A(tile) B(tile) over k in [0, k_end), the stages of LoadStage.
template <bool kAIMajor, bool kBJMajor>
__device__ __forceinline__ void MainLoop(const TileArgs& t, __nv_bfloat16* smem,
                                         float (&acc)[kFragsI][kFragsJ][4]) {
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int wi = (warp / kWarpsJ) * kWarpI, wj = (warp % kWarpsJ) * kWarpJ;
  const int64_t steps = (t.k_end + kStepK - 1) / kStepK;
  auto sa = [&](int s) { return smem + (2 * s) * kOperandElems; };
  auto sb = [&](int s) { return smem + (2 * s + 1) * kOperandElems; };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) LoadStage<kAIMajor, kBJMajor>(t, s * kStepK, sa(s), sb(s));
    CpAsyncCommit();
  }
  for (int64_t step = 0; step < steps; ++step) {
    // Groups committed so far: kStages - 1 + step; with at most kStages - 2 pending, step's
    // group has landed (for this thread; the barrier makes it so for all, and tells every warp
    // that the stage the prefetch below overwrites, read in step - 1, is free).
    CpAsyncWaitPending<kStages - 2>();
    __syncthreads();
    const int64_t next = step + kStages - 1;
    if (next < steps) {
      const int s = static_cast<int>(next % kStages);
      LoadStage<kAIMajor, kBJMajor>(t, next * kStepK, sa(s), sb(s));
    }
    CpAsyncCommit();
    const int s = static_cast<int>(step % kStages);
    const __nv_bfloat16* a = sa(s);
    const __nv_bfloat16* b = sb(s);
#pragma unroll
    for (int kk = 0; kk < kStepK; kk += 16) {
      uint32_t af[kFragsI][4], bf[kFragsJ][2];
#pragma unroll
      for (int fi = 0; fi < kFragsI; ++fi) {
        const int i = wi + fi * 16;
        if constexpr (kAIMajor) {
          LoadFragAx4(af[fi], a + i * (kStepK + kPad), kStepK + kPad, kk);
        } else {
          LoadFragAT(af[fi], a, kTileI + kPad, i, kk);
        }
      }
#pragma unroll
      for (int fj = 0; fj < kFragsJ; fj += 2) {
        const int j = wj + fj * 8;
        if constexpr (kBJMajor) {
          LoadFragBT2(bf[fj], bf[fj + 1], b + j * (kStepK + kPad), kStepK + kPad, kk);
        } else {
          LoadFragB2(bf[fj], bf[fj + 1], b, kTileJ + kPad, kk, j);
        }
      }
#pragma unroll
      for (int fi = 0; fi < kFragsI; ++fi) {
#pragma unroll
        for (int fj = 0; fj < kFragsJ; ++fj) MmaBf16(acc[fi][fj], af[fi], bf[fj]);
      }
    }
  }
  CpAsyncWaitPending<0>();  // no copy may still be in flight when the CTA exits
}

// C[i0 + i][j0 + j] (+)= acc for i < i_end - i0 and j < j_end - j0 (row stride ldc; c points at
// C's row 0). j_end is even, so a lane's pair of columns is wholly in or out.
template <typename OutT>
__device__ __forceinline__ void StoreTile(const float (&acc)[kFragsI][kFragsJ][4], OutT* c,
                                          int64_t ldc, int64_t i0, int64_t i_end, int64_t j0,
                                          int64_t j_end, bool add) {
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t wi = i0 + (warp / kWarpsJ) * kWarpI, wj = j0 + (warp % kWarpsJ) * kWarpJ;
#pragma unroll
  for (int fi = 0; fi < kFragsI; ++fi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // c[0..1]: row g; c[2..3]: row g + 8
      const int64_t i = wi + fi * 16 + g + 8 * half;
      if (i >= i_end) continue;
#pragma unroll
      for (int fj = 0; fj < kFragsJ; ++fj) {
        const int64_t j = wj + fj * 8 + 2 * t;
        if (j >= j_end) continue;
        Store2(c + i * ldc + j, acc[fi][fj][2 * half], acc[fi][fj][2 * half + 1], add);
      }
    }
  }
}

// Expert e's rows [lo, hi), clamped into [0, m] (bad offsets stay inside the tensors).
template <typename Off>
__device__ __forceinline__ void ExpertRows(const Off* offsets, int e, int64_t m, int64_t* lo,
                                           int64_t* hi) {
  const int64_t a = min(max(static_cast<int64_t>(offsets[e]), int64_t{0}), m);
  *lo = a;
  *hi = min(max(static_cast<int64_t>(offsets[e + 1]), a), m);
}

// The forward (kAIMajor = true, kBJMajor = true) and the input grad (true, false): one C tile of
// expert rows. a: [M, lda] row-major; w: [E, ...] with w_stride elements per expert; c: [M, ldc].
template <Product kProduct, typename Off, typename OutT>
__global__ void __launch_bounds__(kThreads, 2)
    RowTilesKernel(const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ w,
                   const Off* __restrict__ offsets, int num_experts, int64_t m, int64_t n_out,
                   int64_t k_sum, int64_t tiles_j, OutT* __restrict__ c, bool add) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* smem = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __shared__ int64_t found[2];  // expert, its tile; -1: past the last tile
  const int64_t slot = static_cast<int64_t>(blockIdx.x) / tiles_j;
  const int64_t tj = static_cast<int64_t>(blockIdx.x) % tiles_j;
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    int64_t base = 0;  // tiles of the experts before this step's 32
    int64_t expert = -1, tile = 0;
    for (int e0 = 0; e0 < num_experts; e0 += 32) {
      const int e = e0 + lane;
      int64_t tiles = 0;
      if (e < num_experts) {
        int64_t lo, hi;
        ExpertRows(offsets, e, m, &lo, &hi);
        tiles = (hi - lo + kTileI - 1) / kTileI;
      }
      int64_t incl = tiles;  // inclusive prefix over the lanes
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int64_t v = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += v;
      }
      const int64_t total = __shfl_sync(0xffffffffu, incl, 31);
      if (slot < base + total) {
        // The one lane with base + incl - tiles <= slot < base + incl.
        const bool mine = slot >= base + incl - tiles && slot < base + incl;
        const unsigned who = __ballot_sync(0xffffffffu, mine);
        const int src = __ffs(who) - 1;
        expert = __shfl_sync(0xffffffffu, static_cast<int64_t>(e), src);
        tile = slot - base - __shfl_sync(0xffffffffu, incl - tiles, src);
        break;
      }
      base += total;
    }
    if (lane == 0) {
      found[0] = expert;
      found[1] = tile;
    }
  }
  __syncthreads();
  const int64_t expert = found[0];
  if (expert < 0) return;
  int64_t lo, hi;
  ExpertRows(offsets, static_cast<int>(expert), m, &lo, &hi);
  TileArgs t;
  t.a = a;
  t.lda = k_sum;
  t.i0 = lo + found[1] * kTileI;
  t.i_end = hi;
  t.j0 = tj * kTileJ;
  t.j_end = n_out;
  t.k_end = k_sum;
  t.b = w + expert * n_out * k_sum;
  constexpr bool kBJMajor = kProduct == Product::kForward;
  t.ldb = kBJMajor ? k_sum : n_out;  // forward: W_e [n_out][k_sum]; input grad: W_e [k_sum][n_out]
  float acc[kFragsI][kFragsJ][4] = {};
  MainLoop<true, kBJMajor>(t, smem, acc);
  StoreTile(acc, c, n_out, t.i0, t.i_end, t.j0, t.j_end, add);
}

// The weight grad: dW_e [N, K] += dY[rows_e]^T X[rows_e]; CTA (x, y) = (tile of dW_e, e).
template <typename Off>
__global__ void __launch_bounds__(kThreads, 2)
    WeightGradKernel(const __nv_bfloat16* __restrict__ dy, const __nv_bfloat16* __restrict__ x,
                     const Off* __restrict__ offsets, int64_t m, int64_t n, int64_t k,
                     int64_t tiles_j, float* __restrict__ dw) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* smem = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  const int e = static_cast<int>(blockIdx.y);
  int64_t lo, hi;
  ExpertRows(offsets, e, m, &lo, &hi);
  if (hi == lo) return;
  TileArgs t;
  t.a = dy + lo * n;  // A(i, r) = dY[lo + r][i]: the [r][i] tile is k-major
  t.lda = n;
  t.b = x + lo * k;  // B(r, j) = X[lo + r][j]
  t.ldb = k;
  t.i0 = (static_cast<int64_t>(blockIdx.x) / tiles_j) * kTileI;
  t.i_end = n;
  t.j0 = (static_cast<int64_t>(blockIdx.x) % tiles_j) * kTileJ;
  t.j_end = k;
  t.k_end = hi - lo;
  float acc[kFragsI][kFragsJ][4] = {};
  MainLoop<false, false>(t, smem, acc);
  StoreTile(acc, dw + static_cast<int64_t>(e) * n * k, k, t.i0, t.i_end, t.j0, t.j_end, true);
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename Kernel>
Status SetSmem(Kernel kernel) {
  return CudaStatus(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
      "grouped_gemm shared memory");
}

template <Product kProduct, typename Off, typename OutT>
Status LaunchRows(const Tensor& a, const Tensor& w, const Tensor& offsets, int64_t n_out,
                  int64_t k_sum, bool add, Tensor* c) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(a.device().index));
  const int64_t m = a.dim(0), e = w.dim(0);
  const int64_t tiles_j = CeilDiv(n_out, kTileJ);
  const int64_t blocks = (CeilDiv(m, kTileI) + e) * tiles_j;
  if (m == 0) return Status::OK();
  auto kernel = RowTilesKernel<kProduct, Off, OutT>;
  ORRERY_RETURN_IF_ERROR(SetSmem(kernel));
  kernel<<<static_cast<unsigned>(blocks), kThreads, kSmemBytes, ctx->stream()>>>(
      a.data<__nv_bfloat16>(), w.data<__nv_bfloat16>(), offsets.data<Off>(), static_cast<int>(e), m,
      n_out, k_sum, tiles_j, c->data<OutT>(), add);
  return LastLaunchStatus("grouped_gemm RowTilesKernel");
}

template <Product kProduct, typename OutT>
Status DispatchOffsets(const Tensor& a, const Tensor& w, const Tensor& offsets, int64_t n_out,
                       int64_t k_sum, bool add, Tensor* c) {
  return offsets.dtype() == DType::kI64
             ? LaunchRows<kProduct, int64_t, OutT>(a, w, offsets, n_out, k_sum, add, c)
             : LaunchRows<kProduct, int32_t, OutT>(a, w, offsets, n_out, k_sum, add, c);
}

template <typename Off>
Status LaunchWeightGrad(const Tensor& dy, const Tensor& x, const Tensor& offsets, Tensor* dw) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(dy.device().index));
  const int64_t m = dy.dim(0), n = dy.dim(1), k = x.dim(1), e = dw->dim(0);
  if (m == 0) return Status::OK();
  const int64_t tiles_j = CeilDiv(k, kTileJ);
  const dim3 grid(static_cast<unsigned>(CeilDiv(n, kTileI) * tiles_j), static_cast<unsigned>(e));
  auto kernel = WeightGradKernel<Off>;
  ORRERY_RETURN_IF_ERROR(SetSmem(kernel));
  kernel<<<grid, kThreads, kSmemBytes, ctx->stream()>>>(
      dy.data<__nv_bfloat16>(), x.data<__nv_bfloat16>(), offsets.data<Off>(), m, n, k, tiles_j,
      dw->data<float>());
  return LastLaunchStatus("grouped_gemm WeightGradKernel");
}

}  // namespace

Status GroupedGemmForwardMma(const Tensor& x, const Tensor& w, const Tensor& offsets, Tensor* y) {
  const int64_t n = w.dim(1), k = w.dim(2);
  return y->dtype() == DType::kF32
             ? DispatchOffsets<Product::kForward, float>(x, w, offsets, n, k, false, y)
             : DispatchOffsets<Product::kForward, __nv_bfloat16>(x, w, offsets, n, k, false, y);
}

Status GroupedGemmInputGradMma(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                               bool accumulate, Tensor* dx) {
  // C = dX [M, K]: C columns are W's K, the sum runs over W's N.
  const int64_t n = w.dim(1), k = w.dim(2);
  return dx->dtype() == DType::kF32
             ? DispatchOffsets<Product::kInputGrad, float>(dy, w, offsets, k, n, accumulate, dx)
             : DispatchOffsets<Product::kInputGrad, __nv_bfloat16>(dy, w, offsets, k, n, accumulate,
                                                                   dx);
}

Status GroupedGemmWeightGradMma(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                                Tensor* dw) {
  return offsets.dtype() == DType::kI64 ? LaunchWeightGrad<int64_t>(dy, x, offsets, dw)
                                        : LaunchWeightGrad<int32_t>(dy, x, offsets, dw);
}

}  // namespace orrery::kernels::cuda
