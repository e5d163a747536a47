// The grouped GEMMs of kernels/grouped_gemm.h on Hopper's own path: wgmma.mma_async (bf16 x bf16
// -> f32, both operands from shared memory) fed by TMA (cp.async.bulk.tensor) through an
// mbarrier pipeline, one persistent kernel for the three operand layouts and for the fused GLU
// (GroupedGemmGlu). sm_90a only; on other devices, or when ORRERY_GROUPED_GEMM=mma, the mma.sync
// kernel (grouped_gemm.cu) runs the three products instead. Not yet timed.
//
//   product      C rows (i)     C cols (j)   sum (k)      A(i, k)              B(k, j)
//   forward      expert row r   n < N        K            X[r][k]   K-major    W_e[j][k]  K-major
//   input grad   expert row r   k' < K       n < N        dY[r][n]  K-major    W_e[n][k'] MN-major
//   weight grad  n < N          k' < K       expert row   dY[r][i]  MN-major   X[r][j]    MN-major
//   GLU          expert row r   f < F (x2)   K            X[r][k]   K-major    W1_e, W3_e K-major
//
// wgmma's transpose bits (bf16 has them): imm-trans-a = 1 for the MN-major A (weight grad only),
// imm-trans-b = 1 for the MN-major B (input and weight grad). The shared layouts, descriptors,
// accumulator map and tile schedule are grouped_gemm_wgmma_layout.h's (checked there on the host).
//
// Tiles: C tiles of kTileM x tile_n = 128 x 256 or 128 x 128, reduced in stages of kTileK = 64
// (16 KB of A + 32 or 16 KB of B a stage; 4 or 6 stages: 192 KB of shared memory, one CTA per SM).
// The width is the launch's: 128 where its twice as many tiles fill the last round of the
// persistent CTAs better (ChooseTileN, from the tile count estimated from M and E: the offsets are
// on the device), else 256 (ORRERY_GROUPED_GEMM=wgmma128 or wgmma256 forces one). The GLU's tile is
// 128 x tile_n / 2 of h: its B stage holds tile_n / 2 rows of W1_e and the same rows of W3_e, so a
// thread's accumulator r (r < tile_n / 4) is a's and r + tile_n / 4 is u's at the same (row,
// column), and the epilogue writes h = act(a, u) (glu_value.cuh, the element-wise kernel's
// formula), and a and u when asked for.
//
// CTA: 3 warpgroups (384 threads). Warpgroup 0 is the producer (setmaxnreg.dec to 56 registers:
// with 40 its 64-bit schedule arithmetic spilled): its first warp walks the tile schedule and one
// lane issues each stage's TMA boxes after the stage's `empty` barrier, with the stage's byte count
// on its `full` barrier. Warpgroups 1 and 2 are the consumers (setmaxnreg.inc to 224): each waits
// on `full`, issues 4 wgmma m64n(tile_n)k16 for its 64 C rows, commits, and after wgmma.wait_group
// 1 (the previous stage's group done) its warps arrive on that stage's `empty` barrier; tile_n / 2
// f32 accumulators a thread. Persistent: the grid is one CTA per SM (fewer when there are fewer
// tiles); CTA b takes tiles b, b + grid, ...; each warp finds a tile's expert itself (a warp prefix
// sum over 32 experts' tile counts, resumed from the last tile's position: the offsets stay on the
// device), so the producer runs all its stages into the next tile while the consumers store the
// last one. A broken pipeline traps (the producer's timed waits) rather than hanging.
//
// Ragged experts. The row products load an A tile of 128 rows from the expert's first row with
// one tensor map over all M rows: rows past the expert's end come from the next expert (or are
// zero past M) and reach only C rows past the end, which the epilogue does not write (each C row
// depends on its own A row alone). The weight grad reduces over the rows, so its last stage of an
// expert zeroes the rows past the expert's end in both operands in shared memory (the consumers,
// then fence.proxy.async and a named barrier of the 256 consumer threads) before wgmma reads
// them. Column edges (N, K not multiples of the tile) are TMA's zero fill at the tensor's edge
// (W as a 3-D [E, N, K] map, so no expert reads its neighbour's rows); boxes wholly past an edge
// are not loaded (their C columns are not written).
// Epilogue: registers straight to global memory, a lane's two adjacent columns at a time, masked
// to the expert's rows and the matrix's columns (Store2: overwrite, or add for the accumulated dX
// and dW).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>

#include "kernels/cuda/device_context.h"
#include "kernels/cuda/glu_value.cuh"
#include "kernels/cuda/grouped_gemm_cuda.h"
#include "kernels/cuda/grouped_gemm_store.cuh"
#include "kernels/cuda/grouped_gemm_wgmma_layout.h"
#include "kernels/cuda/hopper.cuh"

namespace orrery::kernels::cuda {
namespace {

using namespace grouped_gemm_wgmma;  // NOLINT: the layout's constants and index maps

// Stages: as many as fit 192 KB of shared memory (4 of 48 KB for 256-column tiles, 6 of 32 KB for
// 128-column ones).
constexpr int kStageBudgetBytes = 192 * 1024;
constexpr int Stages(int tile_n) { return kStageBudgetBytes / StageBytes(tile_n); }
constexpr int SmemBytes(int tile_n) {  // + alignment slack
  return Stages(tile_n) * StageBytes(tile_n) + kSwizzleAtomBytes;
}
constexpr int kConsumers = 2;  // consumer warpgroups, 64 C rows each
constexpr int kThreads = 128 * (1 + kConsumers);
constexpr int kConsumerThreads = 128 * kConsumers;
constexpr int kProducerRegs = 56, kConsumerRegs = 224;  // 128 x 56 + 256 x 224 <= 64K registers
constexpr int kZeroBarrier = 1;  // named barrier of the consumers (0 is __syncthreads')
static_assert(kTileM == 64 * kConsumers, "a consumer warpgroup's m64 per 64 rows of the tile");
static_assert(kStageABytes == kConsumers * kMnBlockBytes, "MN-major A: a 64-block per consumer");

// ---- PTX wrappers (sm_90a) ----

// The wrappers this kernel shares with the attention kernels (kernels/cuda/hopper.cuh); its own
// below are those whose form differs (a trapping timed wait, TMA with the barrier first, 3-d TMA).
using hopper::BarrierArrive;
using hopper::BarrierArriveExpectTx;
using hopper::SmemAddr;
using hopper::WgmmaCommit;
using hopper::WgmmaFence;
using hopper::WgmmaWait;

__device__ __forceinline__ void BarrierInit(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddr(bar)), "r"(count));
}

// Waits until the barrier's phase of this parity has completed. kTimed (the producer's waits): a
// wait longer than 2^31 ns (2.1 s; no stage of a working pipeline waits a millisecond) traps, so
// that a broken pipeline fails the launch with an error instead of hanging the device. The clock
// is %globaltimer_lo (32 bits of ns, wrapping every 4.3 s: the modular difference is exact while
// the checks, every 1024 polls, come more often than that). The consumers' waits are plain (the
// timer's registers would spill beside their accumulators): the producer waits for every stage's
// release before it exits, so a consumer stuck on a stage stalls a timed wait of the producer.
template <bool kTimed>
__device__ __forceinline__ void BarrierWait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = SmemAddr(bar);
  uint32_t done = 0, start = 0;
  for (uint32_t polls = 1; !done; ++polls) {
    if (kTimed && polls % 1024 == 0) {
      uint32_t now;
      asm volatile("mov.u32 %0, %%globaltimer_lo;" : "=r"(now));
      if (polls == 1024) start = now;
      if (now - start > 0x80000000u) __trap();
    }
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  }
}

// One TMA box into shared memory, completing `bytes` on bar (coordinates innermost first).
__device__ __forceinline__ void TmaLoad2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0,
                                          int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(SmemAddr(bar)), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void TmaLoad3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0,
                                          int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(SmemAddr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

#define ORRERY_ACC8(i)                                                                        \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])

// d (64 x 256 of this warpgroup, f32) += A (64 x 16) B (16 x 256), both from shared memory
// (scale-d is always 1: the accumulators start at zero).
template <int kTransA, int kTransB>
__device__ __forceinline__ void Wgmma64x256(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "
      "%127}, %128, %129, p, 1, 1, %131, %132;\n"
      "}\n"
      : ORRERY_ACC8(0), ORRERY_ACC8(8), ORRERY_ACC8(16), ORRERY_ACC8(24), ORRERY_ACC8(32),
        ORRERY_ACC8(40), ORRERY_ACC8(48), ORRERY_ACC8(56), ORRERY_ACC8(64), ORRERY_ACC8(72),
        ORRERY_ACC8(80), ORRERY_ACC8(88), ORRERY_ACC8(96), ORRERY_ACC8(104), ORRERY_ACC8(112),
        ORRERY_ACC8(120)
      : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kTransA), "n"(kTransB));
}
// The same for 128 columns (m64n128k16: 64 accumulators a thread).
template <int kTransA, int kTransB>
__device__ __forceinline__ void Wgmma64x128(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, %67, %68;\n"
      "}\n"
      : ORRERY_ACC8(0), ORRERY_ACC8(8), ORRERY_ACC8(16), ORRERY_ACC8(24), ORRERY_ACC8(32),
        ORRERY_ACC8(40), ORRERY_ACC8(48), ORRERY_ACC8(56)
      : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kTransA), "n"(kTransB));
}

// The warpgroup's m64n(kTileN)k16 step.
template <int kTileN, int kTransA, int kTransB>
__device__ __forceinline__ void Wgmma(float (&d)[AccRegs(kTileN)], uint64_t desc_a,
                                      uint64_t desc_b) {
  if constexpr (kTileN == kWideTileN) {
    Wgmma64x256<kTransA, kTransB>(d, desc_a, desc_b);
  } else {
    static_assert(kTileN == kNarrowTileN, "tiles of 256 or 128 columns");
    Wgmma64x128<kTransA, kTransB>(d, desc_a, desc_b);
  }
}

#undef ORRERY_ACC8

// ---- the tile schedule on the device ----

// A warp's position in the running prefix over the experts' tile counts: experts before e_base
// hold `before` tiles. Tile numbers only grow, so the walk resumes where the last one stopped.
struct TileCursor {
  int e_base = 0;
  int64_t before = 0;
};

struct Tile {
  int expert;
  int64_t local;   // the tile's number within its expert
  int64_t lo, hi;  // the expert's rows (clamped)
};

// Finds tile `idx` (the same on every lane of the calling warp); false past the last tile.
template <bool kWeightGrad, typename Off>
__device__ __forceinline__ bool FindTile(const Off* __restrict__ offsets, const GemmShape& s,
                                         int64_t idx, TileCursor* cur, Tile* t) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  while (cur->e_base < s.num_experts) {
    const int e = cur->e_base + lane;
    int64_t lo = 0, hi = 0, tiles = 0;
    if (e < s.num_experts) {
      ClampRows(static_cast<int64_t>(offsets[e]), static_cast<int64_t>(offsets[e + 1]), s.m, &lo,
                &hi);
      tiles = ExpertTiles(kWeightGrad, hi - lo, s.tiles_m, s.tiles_n);
    }
    int64_t incl = tiles;  // inclusive prefix over the lanes
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int64_t v = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += v;
    }
    const int64_t total = __shfl_sync(0xffffffffu, incl, 31);
    if (idx < cur->before + total) {
      // The one lane whose range [before + incl - tiles, before + incl) holds idx.
      const bool mine = idx >= cur->before + incl - tiles && idx < cur->before + incl;
      const int src = __ffs(__ballot_sync(0xffffffffu, mine)) - 1;
      t->expert = cur->e_base + src;
      t->local = idx - cur->before - __shfl_sync(0xffffffffu, incl - tiles, src);
      t->lo = __shfl_sync(0xffffffffu, lo, src);
      t->hi = __shfl_sync(0xffffffffu, hi, src);
      return true;
    }
    cur->before += total;
    cur->e_base += 32;
  }
  return false;
}

// ---- the kernel ----

// The fused GLU's extra outputs: the pre-activations a, u (both null or both set) and the
// activation.
template <typename OutT>
struct GluOut {
  OutT* a;
  OutT* u;
  GluParams act;
};

// map_b2 (kGlu only): the up weight W3, loaded beside the gate weight W1 of map_b.
template <Product kProduct, int kTileN, typename Off, typename OutT>
__global__ void __launch_bounds__(kThreads, 1)
    WgmmaKernel(const __grid_constant__ CUtensorMap map_a,
                const __grid_constant__ CUtensorMap map_b,
                const __grid_constant__ CUtensorMap map_b2, const Off* __restrict__ offsets,
                GemmShape s, OutT* __restrict__ c, bool add, GluOut<OutT> glu) {
  constexpr bool kWeightGrad = kProduct == Product::kWeightGrad;
  constexpr int kColTile = ColTile(kProduct, kTileN);
  constexpr int kStages = Stages(kTileN);
  constexpr int kStageBytes = StageBytes(kTileN);
  constexpr int kAccRegs = AccRegs(kTileN);
  constexpr bool kAMnMajor = AMnMajor(kProduct);
  constexpr bool kBMnMajor = BMnMajor(kProduct);
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full[kStages], empty[kStages];
  // Stages at the first 1024-byte boundary of the shared window (the swizzle's period).
  const uint32_t raw = SmemAddr(smem_raw);
  unsigned char* smem =
      smem_raw + ((kSwizzleAtomBytes - raw % kSwizzleAtomBytes) % kSwizzleAtomBytes);
  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  const int lane = static_cast<int>(threadIdx.x) % 32;

  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      BarrierInit(&full[i], 1);                // the producer's arrive.expect_tx
      BarrierInit(&empty[i], 4 * kConsumers);  // one arrival per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();

  if (warpgroup == 0) {
    // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
    if (threadIdx.x >= 32) return;
    TileCursor cur;
    int stage = 0;
    uint32_t phase = 0;
    for (int64_t idx = blockIdx.x;; idx += gridDim.x) {
      Tile t;
      if (!FindTile<kWeightGrad>(offsets, s, idx, &cur, &t)) break;
      const TilePlace p =
          PlaceTile(kWeightGrad, t.local, t.lo, t.hi, s.tiles_n, s.k_tiles, kColTile);
      for (int64_t kt = 0; kt < p.k_tiles; ++kt) {
        BarrierWait<true>(&empty[stage], phase ^ 1);  // a fresh barrier passes parity 1 at once
        if (lane == 0) {
          unsigned char* st = smem + stage * kStageBytes;
          BarrierArriveExpectTx(&full[stage], StageBytes(kProduct, s, p));
          const int boxes = BoxCount(kProduct, s, p);
#pragma unroll
          for (int i = 0; i < 6; ++i) {  // at most 6 boxes (the weight grad's 2 + 4)
            if (i < boxes) {
              const Box b = BoxAt(kProduct, s, t.expert, t.lo, p, kt, i);
              const CUtensorMap* map =
                  b.map == kMapA ? &map_a : (b.map == kMapB ? &map_b : &map_b2);
              if (MapIs3d(kProduct, b.map)) {
                TmaLoad3d(st + b.smem, map, &full[stage], b.c0, b.c1, b.c2);
              } else {
                TmaLoad2d(st + b.smem, map, &full[stage], b.c0, b.c1);
              }
            }
          }
        }
        __syncwarp();
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
    // Every stage's last fill released by the consumers (timed: see BarrierWait).
    for (int i = 0; i < kStages; ++i) {
      BarrierWait<true>(&empty[stage], phase ^ 1);
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
    return;
  }

  // ---- consumers ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
  const int w = warpgroup - 1;  // this consumer's 64 C rows of a tile
  const int tid = static_cast<int>(threadIdx.x) - 128 * warpgroup;  // within the warpgroup
  const int ctid = static_cast<int>(threadIdx.x) - 128;             // within the consumers
  const uint32_t smem_base = SmemAddr(smem);
  TileCursor cur;
  int stage = 0;
  uint32_t phase = 0;
  for (int64_t idx = blockIdx.x;; idx += gridDim.x) {
    Tile t;
    if (!FindTile<kWeightGrad>(offsets, s, idx, &cur, &t)) break;
    const TilePlace p = PlaceTile(kWeightGrad, t.local, t.lo, t.hi, s.tiles_n, s.k_tiles, kColTile);
    float acc[kAccRegs];
#pragma unroll
    for (int i = 0; i < kAccRegs; ++i) acc[i] = 0.0f;
    int prev = -1;
    for (int64_t kt = 0; kt < p.k_tiles; ++kt) {
      BarrierWait<false>(&full[stage], phase);
      if constexpr (kWeightGrad) {
        // The expert's last stage: rows past its end (the next expert's, or TMA's zeros past M)
        // become zeros in both operands before wgmma reads them.
        const int64_t valid = t.hi - (t.lo + kt * kTileK);
        if (valid < kTileK) {
          unsigned char* st = smem + stage * kStageBytes;
          constexpr int kChunks = kStageBytes / 16;  // 16-byte chunks: boxes x 64 rows x 8
#pragma unroll 4
          for (int i = ctid; i < kChunks; i += kConsumerThreads) {
            if (ChunkPastRows(i, valid)) {
              *reinterpret_cast<uint4*>(st + 16 * i) = make_uint4(0, 0, 0, 0);
            }
          }
          asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
          asm volatile("bar.sync %0, %1;" ::"n"(kZeroBarrier), "n"(kConsumerThreads) : "memory");
        }
      }
      const uint32_t sa = smem_base + stage * kStageBytes;
      const uint32_t sb = sa + kStageABytes;
      hopper::FenceRegisters(acc);
      WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < kTileK / kWgmmaK; ++kk) {
        const uint64_t da = MakeDescriptor(sa + DescriptorStart(kAMnMajor, 64 * w, kk),
                                           DescriptorLbo(kAMnMajor), DescriptorSbo());
        const uint64_t db = MakeDescriptor(sb + DescriptorStart(kBMnMajor, 0, kk),
                                           DescriptorLbo(kBMnMajor), DescriptorSbo());
        Wgmma<kTileN, kAMnMajor ? 1 : 0, kBMnMajor ? 1 : 0>(acc, da, db);
      }
      WgmmaCommit();
      WgmmaWait<1>();  // the previous stage's group is done: release that stage
      if (prev >= 0 && lane == 0) BarrierArrive(&empty[prev]);
      prev = stage;
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
    WgmmaWait<0>();
    hopper::FenceRegisters(acc);
    if (prev >= 0 && lane == 0) BarrierArrive(&empty[prev]);

    // ---- epilogue: this warpgroup's 64 x tile_n of C ----
    const int64_t row_base = p.c_row0 + 64 * w;
    const int64_t row_end = kWeightGrad ? s.c_rows : t.hi;
    if constexpr (kProduct == Product::kGlu) {
      // Columns j < kColTile of the result are a's (registers r < kAccRegs / 2), kColTile + j are
      // u's (r + kAccRegs / 2).
      constexpr int kU = kAccRegs / 2;
#pragma unroll
      for (int r = 0; r < kU; r += 2) {
        const int64_t row = row_base + AccRow(tid, r);
        const int64_t col = p.c_col0 + AccCol(tid, r);
        if (row < row_end && col < s.n_out) {
          const int64_t at = row * s.n_out + col;
          Store2(c + at, GluValue(glu.act, acc[r], acc[r + kU]),
                 GluValue(glu.act, acc[r + 1], acc[r + kU + 1]), false);
          if (glu.a != nullptr) {
            Store2(glu.a + at, acc[r], acc[r + 1], false);
            Store2(glu.u + at, acc[r + kU], acc[r + kU + 1], false);
          }
        }
      }
    } else {
      OutT* ct = kWeightGrad ? c + static_cast<int64_t>(t.expert) * s.c_rows * s.n_out : c;
#pragma unroll
      for (int r = 0; r < kAccRegs; r += 2) {
        const int64_t row = row_base + AccRow(tid, r);
        const int64_t col = p.c_col0 + AccCol(tid, r);
        if (row < row_end && col < s.n_out) {
          Store2(ct + row * s.n_out + col, acc[r], acc[r + 1], kWeightGrad || add);
        }
      }
    }
  }
}

// ---- host side ----

// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda link).
StatusOr<PFN_cuTensorMapEncodeTiled_v12000> EncodeTiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static cudaError_t err = cudaSuccess;
  static cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSuccess;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                           &found);
    fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  });
  ORRERY_RETURN_IF_ERROR(CudaStatus(err, "grouped_gemm: cudaGetDriverEntryPointByVersion"));
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    return InternalError("grouped_gemm: the driver has no cuTensorMapEncodeTiled");
  }
  return fn;
}

// A bf16 tensor map of `rank` dims (innermost first; strides of dims 1.. in bytes) with the
// 128-byte swizzle and zero fill outside the tensor.
Status EncodeMap(CUtensorMap* map, const void* base, int rank, const cuuint64_t* dims,
                 const cuuint64_t* strides, const cuuint32_t* box, const char* what) {
  ORRERY_ASSIGN_OR_RETURN(PFN_cuTensorMapEncodeTiled_v12000 encode, EncodeTiled());
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, static_cast<cuuint32_t>(rank),
                            const_cast<void*>(base), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return InternalError(std::string("grouped_gemm: cuTensorMapEncodeTiled failed for ") + what +
                         " (CUresult " + std::to_string(static_cast<int>(r)) + ")");
  }
  return Status::OK();
}

// A row-major bf16 matrix [rows, cols] as a 2-D map, box [outer rows][inner cols].
Status MatrixMap(CUtensorMap* map, const Tensor& t, BoxExtent box_extent, const char* what) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(t.dim(1)), static_cast<cuuint64_t>(t.dim(0))};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(t.dim(1)) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_extent.inner),
                             static_cast<cuuint32_t>(box_extent.outer)};
  return EncodeMap(map, t.raw_data(), 2, dims, strides, box, what);
}

// The stacked W [E, N, K] as a 3-D map, box [1][outer rows of N][inner cols of K].
Status StackedMap(CUtensorMap* map, const Tensor& w, BoxExtent box_extent) {
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(w.dim(2)), static_cast<cuuint64_t>(w.dim(1)),
                              static_cast<cuuint64_t>(w.dim(0))};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(w.dim(2)) * 2,
                                 static_cast<cuuint64_t>(w.dim(1) * w.dim(2)) * 2};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box_extent.inner),
                             static_cast<cuuint32_t>(box_extent.outer), 1};
  return EncodeMap(map, w.raw_data(), 3, dims, strides, box, "w");
}

StatusOr<int> SmCount(int device) {
  int n = 0;
  ORRERY_RETURN_IF_ERROR(CudaStatus(
      cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device), "grouped_gemm SMs"));
  return n;
}

// The operands' tensor maps (map_b2: the fused GLU's W3; a copy of map_b otherwise).
struct Maps {
  CUtensorMap a, b, b2;
};

// The tile width of a launch: `requested` (kWideTileN or kNarrowTileN), or, for 0, the one of the
// smaller estimated time in rounds of the persistent CTAs (ceil(tiles / SMs); a narrow tile costs
// half a wide one, taken 10% dearer per FLOP for its smaller wgmma; ties go wide). The tile counts
// are estimates: the offsets are on the device.
int ChooseTileN(int requested, double wide_tiles, double narrow_tiles, int sms) {
  if (requested != 0) return requested;
  const double wide = std::ceil(wide_tiles / sms);
  const double narrow = 0.55 * std::ceil(narrow_tiles / sms);
  return narrow < wide ? kNarrowTileN : kWideTileN;
}

template <Product kProduct, int kTileN, typename Off, typename OutT>
Status Launch(const Maps& maps, const Tensor& offsets, const GemmShape& s, int64_t tile_bound,
              int sms, cudaStream_t stream, OutT* c, bool add, GluOut<OutT> glu) {
  const int64_t grid = std::min<int64_t>(tile_bound, sms);
  if (grid <= 0) return Status::OK();
  auto kernel = WgmmaKernel<kProduct, kTileN, Off, OutT>;
  constexpr int kSmem = SmemBytes(kTileN);
  ORRERY_RETURN_IF_ERROR(
      CudaStatus(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                 "grouped_gemm wgmma shared memory"));
  kernel<<<static_cast<unsigned>(grid), kThreads, kSmem, stream>>>(
      maps.a, maps.b, maps.b2, static_cast<const Off*>(offsets.raw_data()), s, c, add, glu);
  return LastLaunchStatus("grouped_gemm WgmmaKernel");
}

// Launches product kProduct on `device` for s.tile_n and the offsets' dtype; tile_bound: an upper
// bound of the tiles.
template <Product kProduct, typename OutT>
Status LaunchOn(int device, const Maps& maps, const Tensor& offsets, const GemmShape& s,
                int64_t tile_bound, OutT* c, bool add, GluOut<OutT> glu = {}) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(device));
  ORRERY_ASSIGN_OR_RETURN(const int sms, SmCount(device));
  const bool i64 = offsets.dtype() == DType::kI64;
  if (s.tile_n == kWideTileN) {
    return i64 ? Launch<kProduct, kWideTileN, int64_t>(maps, offsets, s, tile_bound, sms,
                                                       ctx->stream(), c, add, glu)
               : Launch<kProduct, kWideTileN, int32_t>(maps, offsets, s, tile_bound, sms,
                                                       ctx->stream(), c, add, glu);
  }
  return i64 ? Launch<kProduct, kNarrowTileN, int64_t>(maps, offsets, s, tile_bound, sms,
                                                       ctx->stream(), c, add, glu)
             : Launch<kProduct, kNarrowTileN, int32_t>(maps, offsets, s, tile_bound, sms,
                                                       ctx->stream(), c, add, glu);
}

// The shape of a row product (C [m, n_out] summed over k_sum) at tile width tile_n, chosen as
// ChooseTileN says for `requested`; the row tiles estimated as m / kTileM + E / 2 (an expert's last
// tile half full on average).
StatusOr<GemmShape> RowShape(Product p, int device, int requested, int64_t m, int64_t e,
                             int64_t n_out, int64_t k_sum) {
  ORRERY_ASSIGN_OR_RETURN(const int sms, SmCount(device));
  const double row_tiles = static_cast<double>(m) / kTileM + 0.5 * static_cast<double>(e);
  GemmShape s{};
  s.tile_n = ChooseTileN(
      requested, row_tiles * static_cast<double>(CeilDiv(n_out, ColTile(p, kWideTileN))),
      row_tiles * static_cast<double>(CeilDiv(n_out, ColTile(p, kNarrowTileN))), sms);
  s.num_experts = static_cast<int>(e);
  s.m = m;
  s.tiles_m = 0;
  s.tiles_n = CeilDiv(n_out, ColTile(p, s.tile_n));
  s.k_tiles = CeilDiv(k_sum, kTileK);
  s.n_out = n_out;
  s.c_rows = m;
  return s;
}

// An upper bound of a row product's tiles: sum_e ceil(rows_e / kTileM) <= ceil(M / kTileM) + E.
int64_t RowTileBound(const GemmShape& s) {
  return (CeilDiv(s.m, kTileM) + s.num_experts) * s.tiles_n;
}

// The row products: C [M, n_out] over A [M, k_sum] and W.
template <Product kProduct>
Status RowProduct(const Tensor& a, const Tensor& w, const Tensor& offsets, int64_t n_out,
                  int64_t k_sum, bool add, int tile_n, Tensor* c) {
  const int device = a.device().index;
  ORRERY_ASSIGN_OR_RETURN(const GemmShape s,
                          RowShape(kProduct, device, tile_n, a.dim(0), w.dim(0), n_out, k_sum));
  Maps maps;
  ORRERY_RETURN_IF_ERROR(
      MatrixMap(&maps.a, a, MapBox(kProduct, kMapA, s.tile_n), "the row operand"));
  ORRERY_RETURN_IF_ERROR(StackedMap(&maps.b, w, MapBox(kProduct, kMapB, s.tile_n)));
  maps.b2 = maps.b;
  return c->dtype() == DType::kF32
             ? LaunchOn<kProduct>(device, maps, offsets, s, RowTileBound(s),
                                  static_cast<float*>(c->raw_data()), add)
             : LaunchOn<kProduct>(device, maps, offsets, s, RowTileBound(s),
                                  static_cast<__nv_bfloat16*>(c->raw_data()), add);
}

template <typename OutT>
Status GluProduct(const GluActivation& act, const Tensor& x, const Tensor& w1, const Tensor& w3,
                  const Tensor& offsets, int tile_n, Tensor* h, Tensor* a, Tensor* u) {
  constexpr Product kGlu = Product::kGlu;
  const int device = x.device().index;
  ORRERY_ASSIGN_OR_RETURN(
      const GemmShape s, RowShape(kGlu, device, tile_n, x.dim(0), w1.dim(0), w1.dim(1), w1.dim(2)));
  Maps maps;
  ORRERY_RETURN_IF_ERROR(MatrixMap(&maps.a, x, MapBox(kGlu, kMapA, s.tile_n), "x"));
  ORRERY_RETURN_IF_ERROR(StackedMap(&maps.b, w1, MapBox(kGlu, kMapB, s.tile_n)));
  ORRERY_RETURN_IF_ERROR(StackedMap(&maps.b2, w3, MapBox(kGlu, kMapB2, s.tile_n)));
  GluOut<OutT> glu;
  glu.a = a == nullptr ? nullptr : static_cast<OutT*>(a->raw_data());
  glu.u = u == nullptr ? nullptr : static_cast<OutT*>(u->raw_data());
  glu.act = {act.situ, static_cast<float>(act.beta), static_cast<float>(act.beta_lin)};
  return LaunchOn<kGlu>(device, maps, offsets, s, RowTileBound(s),
                        static_cast<OutT*>(h->raw_data()), false, glu);
}

}  // namespace

bool GroupedGemmWgmmaAvailable(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    return false;
  }
  return major == 9 && minor == 0;  // the sm_90a code of this library
}

bool GroupedGemmWgmmaSupports(int64_t m, int64_t n, int64_t k) {
  constexpr int64_t kMax = int64_t{1} << 31;  // TMA coordinates are 32-bit signed
  return m < kMax && n < kMax && k < kMax;
}

Status GroupedGemmForwardWgmma(const Tensor& x, const Tensor& w, const Tensor& offsets, int tile_n,
                               Tensor* y) {
  return RowProduct<Product::kForward>(x, w, offsets, w.dim(1), w.dim(2), false, tile_n, y);
}

Status GroupedGemmInputGradWgmma(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                 bool accumulate, int tile_n, Tensor* dx) {
  return RowProduct<Product::kInputGrad>(dy, w, offsets, w.dim(2), w.dim(1), accumulate, tile_n,
                                         dx);
}

Status GroupedGemmWeightGradWgmma(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                                  int tile_n, Tensor* dw) {
  constexpr Product kWgrad = Product::kWeightGrad;
  const int device = dy.device().index;
  ORRERY_ASSIGN_OR_RETURN(const int sms, SmCount(device));
  const int64_t e = dw->dim(0), n = dw->dim(1), k = dw->dim(2);
  const double tiles_m = static_cast<double>(e * CeilDiv(n, kTileM));  // experts with rows, at most
  GemmShape s{};
  s.tile_n = ChooseTileN(tile_n, tiles_m * static_cast<double>(CeilDiv(k, kWideTileN)),
                         tiles_m * static_cast<double>(CeilDiv(k, kNarrowTileN)), sms);
  s.num_experts = static_cast<int>(e);
  s.m = dy.dim(0);
  s.tiles_m = CeilDiv(n, kTileM);
  s.tiles_n = CeilDiv(k, s.tile_n);
  s.k_tiles = 0;
  s.n_out = k;
  s.c_rows = n;
  Maps maps;
  ORRERY_RETURN_IF_ERROR(MatrixMap(&maps.a, dy, MapBox(kWgrad, kMapA, s.tile_n), "dy"));
  ORRERY_RETURN_IF_ERROR(MatrixMap(&maps.b, x, MapBox(kWgrad, kMapB, s.tile_n), "x"));
  maps.b2 = maps.b;
  return LaunchOn<kWgrad>(device, maps, offsets, s, e * s.tiles_m * s.tiles_n,
                          static_cast<float*>(dw->raw_data()), true);
}

Status GroupedGemmGluWgmma(const GluActivation& act, const Tensor& x, const Tensor& w1,
                           const Tensor& w3, const Tensor& offsets, int tile_n, Tensor* h,
                           Tensor* a, Tensor* u) {
  return h->dtype() == DType::kF32
             ? GluProduct<float>(act, x, w1, w3, offsets, tile_n, h, a, u)
             : GluProduct<__nv_bfloat16>(act, x, w1, w3, offsets, tile_n, h, a, u);
}

}  // namespace orrery::kernels::cuda
