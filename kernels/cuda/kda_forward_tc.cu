// KDA chunked forward on tensor cores (spec §2.4-§2.6): bf16 operands, fp32 accumulation and
// fp32 state. Three stages, every product a bf16 `mma.sync.m16n8k16` except the 64x64
// triangular solve (fp32 substitution, then tf32 MMAs on split fp32 operands):
//
// 1. KdaChunkPrepKernel, one block per (64-token chunk, head), all chunks at once: the gate's
//    chunk-local cumsum G (log2), the intra-chunk A_qk and A_kk in 16x16 tiles, T = (I + A_kk)^-1
//    (kda_tc_unit_lower_inverse.cuh: the diagonal 16-blocks by forward substitution in registers,
//    the blocks below them in two levels as tf32 MMAs with fp32-grade split operands),
//    W = T (beta K e^G), U = T (beta V), Q~ = s Q e^G, Kbar^T = (K e^{G_C - G})^T, gamma = e^{G_C}.
//    Tile (a, b) of A_qk / A_kk (row sub-tile a >= column sub-tile b) is X_a Y_b^T with the
//    reference row n_a = the first row of sub-tile a: X_a = Q_a e^{G_a - G_{n_a}} (exponent <= 0)
//    and Y_b = K_b e^{G_{n_a} - G_b}. Off the diagonal (b < a) Y's exponent is <= 0 too, safe
//    for every gate. On the diagonal Y reaches e^{span} where span is the tile's decay from its
//    first to its last row: under the bounded gate (g >= -5) span <= 15 * 5 / ln 2 = 108 (log2),
//    so Y fits bf16 (max 2^128) and the masked upper-triangle products stay finite (spec §2.6).
//    The kernel checks the span of every diagonal tile and forms the tiles whose span exceeds
//    kMaxTileSpan (the original, unbounded gate with strong decays) pairwise in fp32 with
//    exponents <= 0, so the result is right for any gate.
// 2. KdaStatePassKernel, per (segment of chunks, head) one group of 4 warps per 64-wide V slice,
//    two groups to a block when the slices pair up (sharing the copies of the chunk's operands:
//    the pass was L2-bound with a copy per slice): the state S (K x 64 slice) in fp32 registers
//    as MMA accumulators; per chunk Vnew = U - W S, O = Q~ S + A_qk Vnew,
//    S <- Diag(gamma) S + Kbar^T Vnew, with S rounded to bf16 in shared memory as the B operand
//    (as fla does). In "transition" slices (V columns >= V) it carries the K x K transition
//    M = prod_n (Diag(gamma_n) - Kbar_n^T W_n) from the identity instead.
// 3. Long sequences (few blocks in stage 2): the chunks of a sequence are split into segments.
//    A first state pass runs every segment but the last from a zero state, giving the segment's
//    end state S_ext and its transition M; KdaSegmentCombineKernel chains
//    S_start(j + 1) = M_j S_start(j) + S_ext_j (fp32, spec §2.5); a second state pass runs every
//    segment from its start state and writes the output. A forward kept for the backward also
//    carries the last segment's transition in the first pass: the backward chains its segments
//    through the transposes of these transitions instead of forming its own.
#include <cuda_bf16.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/kda_cuda.h"
#include "kernels/cuda/kda_cuda_util.cuh"
#include "kernels/cuda/kda_mma.cuh"
#include "kernels/cuda/kda_tc_chunk_load.cuh"
#include "kernels/cuda/kda_tc_layout.cuh"
#include "kernels/cuda/kda_tc_segments.h"
#include "kernels/cuda/kda_tc_state_slice.cuh"
#include "kernels/cuda/kda_tc_unit_lower_inverse.cuh"

namespace orrery::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kChunk = kTcChunk;
constexpr int kSliceV = kTcSliceV;
constexpr int kPrepThreads = 256;  // 8 warps
constexpr int kPassThreads = 128;  // 4 warps, one 16-row sub-tile each

// ---------------------------------------------------------------------------------------------
// Stage 1: per (chunk, head).

template <typename GIn>
struct PrepParams {
  const bf16 *q, *k, *v, *beta;
  const GIn* g;
  const ChunkDesc* chunks;
  bf16* w;       // [chunks, H, 64, K]
  bf16* u;       // [chunks, H, 64, V]
  bf16* qg;      // [chunks, H, 64, K]   s Q e^G
  bf16* kbar_t;  // [chunks, H, K, 64]   (K e^{G_C - G})^T
  bf16* aqk;     // [chunks, H, 64, 64]  lower triangle incl. the diagonal, zeros above
  float* gamma;  // [chunks, H, K]       e^{G_C}
  bf16* tinv;    // [chunks, H, 64, 64]  T = (I + A_kk)^-1, zeros above the diagonal; or null
  int heads;
  float scale;
  ChunkInputTransforms tr;  // applied to q, k, g, beta as they load
};

template <int KD, int VD>
struct PrepSmem {
  static constexpr int kSG = KD + 4;  // floats per G row
  static constexpr int kSK = KD + 8;  // bf16 per q/k row
  static constexpr int kSV = VD + 8;
  static constexpr int kSA = kChunk + 4;  // floats per A/T row (MMA fragment reads conflict-free)
  // Regions are reused once their first content is dead, so that two blocks fit on one SM:
  // X_q and X_k go where A_kk and T will be (they die when the intra-chunk products are in
  // registers), beta v where G was (after the element-wise stage), T in bf16 where A_kk was
  // (after the solve).
  static constexpr size_t kG = 0;
  static constexpr size_t kV = kG;
  static constexpr size_t kQ = kG + sizeof(float) * kChunk * kSG;
  static constexpr size_t kK = kQ + sizeof(bf16) * kChunk * kSK;
  static constexpr size_t kAkk = kK + sizeof(bf16) * kChunk * kSK;
  static constexpr size_t kTb = kAkk;
  static constexpr size_t kT = kAkk + sizeof(float) * kChunk * kSA;
  static constexpr size_t kXq = kAkk;
  static constexpr size_t kXk = kXq + sizeof(bf16) * kChunk * kSK;
  static constexpr size_t kScratch =
      std::max(kT + sizeof(float) * kChunk * kSA, kXk + sizeof(bf16) * kChunk * kSK);
  static constexpr size_t kBeta = kScratch + sizeof(float) * kInverseScratchFloats;
  static constexpr size_t kBytes = kBeta + sizeof(float) * kChunk;
  static_assert(kQ % 16 == 0 && kK % 16 == 0 && kAkk % 16 == 0 && kT % 16 == 0 && kXk % 16 == 0 &&
                    kScratch % 16 == 0 && kBeta % 16 == 0,
                "16-byte aligned regions");
  static_assert(sizeof(bf16) * kChunk * kSV <= sizeof(float) * kChunk * kSG, "v fits over G");
  static_assert(sizeof(bf16) * kChunk * kTileStrideA <= sizeof(float) * kChunk * kSA,
                "T in bf16 fits over A_kk");
};

// kTransforms: p.tr applies (raw inputs); compiled apart so that the plain path carries none of it.
// Two blocks per SM (PrepSmem is sized for it): the register budget is held to 128 per thread.
template <int KD, int VD, typename GIn, bool kTransforms>
__global__ void __launch_bounds__(kPrepThreads, 2) KdaChunkPrepKernel(PrepParams<GIn> p) {
  using L = PrepSmem<KD, VD>;
  constexpr int SG = L::kSG, SK = L::kSK, SV = L::kSV, SA = L::kSA, ST = kTileStrideA;
  extern __shared__ __align__(16) unsigned char smem[];
  float* G = reinterpret_cast<float*>(smem + L::kG);      // [64][SG] cumsum of g, log2
  bf16* qs = reinterpret_cast<bf16*>(smem + L::kQ);       // q, then beta k e^G (stage 4 on)
  bf16* ks = reinterpret_cast<bf16*>(smem + L::kK);       // k
  bf16* vs = reinterpret_cast<bf16*>(smem + L::kV);       // beta v (over G, stage 4 on)
  float* akk = reinterpret_cast<float*>(smem + L::kAkk);  // A_kk (strictly lower), fp32
  float* tm = reinterpret_cast<float*>(smem + L::kT);     // T, fp32
  bf16* tb = reinterpret_cast<bf16*>(smem + L::kTb);      // T, bf16 (over A_kk, after the solve)
  bf16* xq = reinterpret_cast<bf16*>(smem + L::kXq);      // X_q (over A_kk, before it)
  bf16* xk = reinterpret_cast<bf16*>(smem + L::kXk);      // X_k (over A_kk and T, before them)
  float* scratch = reinterpret_cast<float*>(smem + L::kScratch);  // kInverseScratchFloats
  float* bs = reinterpret_cast<float*>(smem + L::kBeta);          // beta

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g8 = lane >> 2, t4 = lane & 3;
  const int h = blockIdx.y, heads = p.heads;
  const ChunkDesc cd = p.chunks[blockIdx.x];
  const int len = static_cast<int>(cd.len);
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * heads + h;

  // 1. Load the chunk and form the gate's cumsum G (rows past the end: zeros, G flat there); each
  // thread keeps its rows' 4 columns of q, k and G in registers (ChunkRowMap).
  const ChunkInputTransforms* tr = kTransforms ? &p.tr : nullptr;
  // beta is fetched first and stored after, so that its load is in flight with the chunk's.
  const float beta_r = tid < len ? LoadBeta(p.beta + (cd.row_start + tid) * heads + h, tr) : 0.0f;
  ChunkQKPieces<KD, kPrepThreads> qk;
  ChunkGatePieces<KD, kPrepThreads> gp;
  LoadChunkQKGate<KD, kPrepThreads>(qs, ks, SK, G, SG, qk, gp, p.q, p.k, p.g, cd, heads, h, tr);
  if (tid < kChunk) bs[tid] = beta_r;  // first read after the barrier that ends stage 2

  // 2. From those registers: the A operands of the intra-chunk tiles, X_q = Q e^{G - G_n} and
  // X_k = K e^{G - G_n} with n the first row of the row's 16-row tile (exponents <= 0), over A_kk
  // and T (dead until the products are in registers); and out Q~ = s Q e^G, gamma = e^{G_C} and
  // Kbar^T = (K e^{G_C - G})^T, whose rows d0 .. d0 + 3 get whole pieces of the thread's rows.
  {
    constexpr int kPer = ChunkRowMap<KD, kPrepThreads>::kPer;
    const int r0 = qk.Row0(), d0 = qk.Col0();
    const float4 gn = *reinterpret_cast<const float4*>(G + (r0 & ~15) * SG + d0);
    const float4 gc = *reinterpret_cast<const float4*>(G + (kChunk - 1) * SG + d0);
    uint32_t kbar[4][kPer / 2];  // column d0 + j of Kbar, rows r0 + 2 i, r0 + 2 i + 1
    float kbar_even[4];          // an even row's, until its odd neighbour's
#pragma unroll
    for (int it = 0; it < kPer; ++it) {
      const int r = r0 + it;
      const float4 g = gp.v[it];
      const float2 q01 = UnpackBf16x2(qk.q[it].x), q23 = UnpackBf16x2(qk.q[it].y);
      const float2 k01 = UnpackBf16x2(qk.k[it].x), k23 = UnpackBf16x2(qk.k[it].y);
      const float4 e = make_float4(Exp2Ftz(g.x - gn.x), Exp2Ftz(g.y - gn.y), Exp2Ftz(g.z - gn.z),
                                   Exp2Ftz(g.w - gn.w));
      *reinterpret_cast<uint2*>(xq + r * SK + d0) =
          make_uint2(PackBf16(q01.x * e.x, q01.y * e.y), PackBf16(q23.x * e.z, q23.y * e.w));
      *reinterpret_cast<uint2*>(xk + r * SK + d0) =
          make_uint2(PackBf16(k01.x * e.x, k01.y * e.y), PackBf16(k23.x * e.z, k23.y * e.w));
      *reinterpret_cast<uint2*>(p.qg + (tile * kChunk + r) * KD + d0) =
          make_uint2(PackBf16(p.scale * q01.x * Exp2Ftz(g.x), p.scale * q01.y * Exp2Ftz(g.y)),
                     PackBf16(p.scale * q23.x * Exp2Ftz(g.z), p.scale * q23.y * Exp2Ftz(g.w)));
      const float kb[4] = {k01.x * Exp2Ftz(gc.x - g.x), k01.y * Exp2Ftz(gc.y - g.y),
                           k23.x * Exp2Ftz(gc.z - g.z), k23.y * Exp2Ftz(gc.w - g.w)};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (it % 2 == 0) {
          kbar_even[j] = kb[j];
        } else {
          kbar[j][it / 2] = PackBf16(kbar_even[j], kb[j]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      bf16* dst = p.kbar_t + (tile * KD + d0 + j) * kChunk + r0;
      if constexpr (kPer == 8) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(kbar[j][0], kbar[j][1], kbar[j][2], kbar[j][3]);
      } else {
        static_assert(kPer == 4, "8 rows a thread at K = 128, 4 at K = 64");
        *reinterpret_cast<uint2*>(dst) = make_uint2(kbar[j][0], kbar[j][1]);
      }
    }
    if (r0 + kPer == kChunk) {
      *reinterpret_cast<float4*>(p.gamma + tile * KD + d0) =
          make_float4(Exp2Ftz(gc.x), Exp2Ftz(gc.y), Exp2Ftz(gc.z), Exp2Ftz(gc.w));
    }
  }
  __syncthreads();

  // 3. A_qk and A_kk: 20 units (tile pair (a, b), b <= a; 8-column half nt), unit u on warp
  // u % 8, products kept in registers until every warp is done with X.
  constexpr int kUnits = 20, kUnitsPerWarp = (kUnits + kPrepThreads / 32 - 1) / (kPrepThreads / 32);
  float aq[kUnitsPerWarp][4], ak[kUnitsPerWarp][4];
#pragma unroll
  for (int slot = 0; slot < kUnitsPerWarp; ++slot) {
    const int unit = warp + slot * (kPrepThreads / 32);
#pragma unroll
    for (int e = 0; e < 4; ++e) aq[slot][e] = ak[slot][e] = 0.0f;
    if (unit >= kUnits) continue;
    const int pair = unit >> 1, nt = unit & 1;
    const int a = pair < 1 ? 0 : pair < 3 ? 1 : pair < 6 ? 2 : 3;
    const int b = pair - a * (a + 1) / 2;
    const int ref = 16 * a, c = 16 * b + 8 * nt + g8;
    bool use_mma = true;
    if (a == b) {
      float span = 0.0f;
      for (int d = lane; d < KD; d += 32)
        span = fmaxf(span, G[ref * SG + d] - G[(ref + 15) * SG + d]);
      for (int o = 16; o > 0; o >>= 1) span = fmaxf(span, __shfl_xor_sync(0xffffffffu, span, o));
      use_mma = span <= kMaxTileSpan;
    }
    if (use_mma) {
      // Y_b = K_b e^{G_ref - G} (exponent <= 0 off the diagonal, <= span on it).
      for (int k0 = 0; k0 < KD; k0 += 16) {
        uint32_t fq[4], fk[4], y[2];
        LoadFragAx4(fq, xq + ref * SK, SK, k0);
        LoadFragAx4(fk, xk + ref * SK, SK, k0);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int d = k0 + 2 * t4 + 8 * j;
          const float2 kc = UnpackBf16x2(*reinterpret_cast<const uint32_t*>(ks + c * SK + d));
          const float2 gr = *reinterpret_cast<const float2*>(G + ref * SG + d);
          const float2 gc = *reinterpret_cast<const float2*>(G + c * SG + d);
          y[j] = PackBf16(kc.x * Exp2Ftz(gr.x - gc.x), kc.y * Exp2Ftz(gr.y - gc.y));
        }
        MmaBf16(aq[slot], fq, y);
        MmaBf16(ak[slot], fk, y);
      }
    } else {
      // Pairwise in fp32, exponents <= 0: each lane computes exactly the entries its
      // accumulators hold.
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = ref + g8 + (e >> 1) * 8, cc = 16 * b + 8 * nt + 2 * t4 + (e & 1);
        float sq = 0.0f, sk = 0.0f;
        if (cc <= r) {
          for (int d = 0; d < KD; ++d) {
            const float kc =
                __bfloat162float(ks[cc * SK + d]) * Exp2Ftz(G[r * SG + d] - G[cc * SG + d]);
            sq += __bfloat162float(qs[r * SK + d]) * kc;
            sk += __bfloat162float(ks[r * SK + d]) * kc;
          }
        }
        aq[slot][e] = sq;
        ak[slot][e] = sk;
      }
    }
  }
  __syncthreads();  // X is dead: A_kk takes its place
  // v for stage 5 (warps 4-7): every piece's load issued here, so that the A outputs and the
  // element-wise stage run while they are in flight (issued in stage 5, their latency sat on the
  // chunk's path: warps 0-3's diagonal solve is shorter).
  constexpr int kVLoaders = kPrepThreads - 128, kVPieces = VD / 8;
  constexpr int kVRowStep = kVLoaders / kVPieces, kVPer = kChunk / kVRowStep;
  static_assert(kVLoaders % kVPieces == 0 && kChunk % kVRowStep == 0, "whole pieces per thread");
  const int v_row0 = (tid - 128) / kVPieces, v_col = (tid - 128) % kVPieces * 8;
  uint4 vv[kVPer];
  if (warp >= 4) {
    const bf16* src = p.v + ((cd.row_start + v_row0) * heads + h) * VD + v_col;
    const int64_t step = static_cast<int64_t>(kVRowStep) * heads * VD;
#pragma unroll
    for (int it = 0; it < kVPer; ++it) {
      vv[it] = make_uint4(0, 0, 0, 0);
      if (v_row0 + it * kVRowStep < len) vv[it] = *reinterpret_cast<const uint4*>(src);
      src += step;
    }
  }
  bf16* aqk_out = p.aqk + tile * kChunk * kChunk;
#pragma unroll
  for (int slot = 0; slot < kUnitsPerWarp; ++slot) {
    const int unit = warp + slot * (kPrepThreads / 32);
    if (unit >= kUnits) continue;
    const int pair = unit >> 1, nt = unit & 1;
    const int a = pair < 1 ? 0 : pair < 3 ? 1 : pair < 6 ? 2 : 3;
    const int b = pair - a * (a + 1) / 2;
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int r = 16 * a + g8 + (e >> 1) * 8, c = 16 * b + 8 * nt + 2 * t4;
      const float q0 = c <= r ? p.scale * aq[slot][e] : 0.0f;
      const float q1 = c + 1 <= r ? p.scale * aq[slot][e + 1] : 0.0f;
      *reinterpret_cast<uint32_t*>(aqk_out + r * kChunk + c) = PackBf16(q0, q1);
      *reinterpret_cast<float2*>(akk + r * SA + c) = make_float2(
          c < r ? bs[r] * ak[slot][e] : 0.0f, c + 1 < r ? bs[r] * ak[slot][e + 1] : 0.0f);
      // An off-diagonal unit also zeros its mirror above the diagonal tiles (tile (b, a), the
      // same rows and columns of it): the state passes read whole tiles of A_qk.
      if (a != b) {
        *reinterpret_cast<uint32_t*>(aqk_out + (r - 16 * (a - b)) * kChunk + c + 16 * (a - b)) = 0u;
      }
    }
  }

  // 4. Element-wise: beta k e^G (over q).
  StoreBetaKExpG<KD, kPrepThreads>(qs, ks, SK, G, SG, bs);
  __syncthreads();  // G is dead from here on; beta v takes its place

  // 5. T = (I + A_kk)^-1 (kda_tc_unit_lower_inverse.cuh): the diagonal 16-blocks on warps 0-3
  // while warps 4-7 store beta v, then the blocks below the diagonal on tensor cores.
  if (warp >= 4) {
#pragma unroll
    for (int it = 0; it < kVPer; ++it) {
      const int r = v_row0 + it * kVRowStep;
      bf16* x = reinterpret_cast<bf16*>(&vv[it]);
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] = __float2bfloat16(bs[r] * __bfloat162float(x[j]));
      *reinterpret_cast<uint4*>(vs + r * SV + v_col) = vv[it];
    }
  } else {
    InvertDiagonalBlock16(akk, SA, tm, SA, 16 * warp);
  }
  __syncthreads();
  InvertOffDiagonalBlocks<kPrepThreads>(akk, SA, tm, SA, scratch);
  // A_kk is dead: T in bf16 over it (and out, for the backward), 8 columns per 16-byte store.
  for (int i = tid; i < kChunk * kChunk / 8; i += kPrepThreads) {
    const int r = i / (kChunk / 8), c = (i % (kChunk / 8)) * 8;
    const float4 t0 = *reinterpret_cast<const float4*>(tm + r * SA + c);
    const float4 t1 = *reinterpret_cast<const float4*>(tm + r * SA + c + 4);
    const float t[8] = {t0.x, t0.y, t0.z, t0.w, t1.x, t1.y, t1.z, t1.w};
    uint4 piece;
    uint32_t* w = reinterpret_cast<uint32_t*>(&piece);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      w[e] = PackBf16(c + 2 * e <= r ? t[2 * e] : 0.0f, c + 2 * e + 1 <= r ? t[2 * e + 1] : 0.0f);
    }
    *reinterpret_cast<uint4*>(tb + r * ST + c) = piece;
    if (p.tinv != nullptr) {
      *reinterpret_cast<uint4*>(p.tinv + (tile * kChunk + r) * kChunk + c) = piece;
    }
  }
  __syncthreads();

  // 6. W = T (beta k e^G), U = T (beta v): warp w owns rows 16 (w / 2) and half the columns.
  {
    const int a = warp >> 1, half = warp & 1;
    constexpr int kNW = KD / 16, kNU = VD / 16;  // n8 tiles per warp
    float acc_w[kNW][4] = {}, acc_u[kNU][4] = {};
    for (int kt = 0; kt <= a; ++kt) {
      uint32_t fa[4];
      LoadFragA(fa, tb + 16 * a * ST, ST, 16 * kt);
#pragma unroll
      for (int nt = 0; nt < kNW; nt += 2) {
        uint32_t fb0[2], fb1[2];
        LoadFragB2(fb0, fb1, qs, SK, 16 * kt, half * (KD / 2) + 8 * nt);
        MmaBf16(acc_w[nt], fa, fb0);
        MmaBf16(acc_w[nt + 1], fa, fb1);
      }
#pragma unroll
      for (int nt = 0; nt < kNU; nt += 2) {
        uint32_t fb0[2], fb1[2];
        LoadFragB2(fb0, fb1, vs, SV, 16 * kt, half * (VD / 2) + 8 * nt);
        MmaBf16(acc_u[nt], fa, fb0);
        MmaBf16(acc_u[nt + 1], fa, fb1);
      }
    }
    // Staged over beta k e^G and beta v once every warp is done with them, each warp's part then
    // out in whole 16-byte pieces (the accumulators' 4-byte stores fill half of each sector).
    __syncthreads();
#pragma unroll
    for (int nt = 0; nt < kNW; ++nt) {
      const int c = half * (KD / 2) + 8 * nt + 2 * t4;
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int r = 16 * a + g8 + (e >> 1) * 8;
        *reinterpret_cast<uint32_t*>(qs + r * SK + c) = PackBf16(acc_w[nt][e], acc_w[nt][e + 1]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < kNU; ++nt) {
      const int c = half * (VD / 2) + 8 * nt + 2 * t4;
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int r = 16 * a + g8 + (e >> 1) * 8;
        *reinterpret_cast<uint32_t*>(vs + r * SV + c) = PackBf16(acc_u[nt][e], acc_u[nt][e + 1]);
      }
    }
    __syncwarp();
    CopyRowsToGlobal<16, KD / 2, 32>(qs + 16 * a * SK + half * (KD / 2), SK,
                                     p.w + (tile * kChunk + 16 * a) * KD + half * (KD / 2), KD,
                                     lane);
    CopyRowsToGlobal<16, VD / 2, 32>(vs + 16 * a * SV + half * (VD / 2), SV,
                                     p.u + (tile * kChunk + 16 * a) * VD + half * (VD / 2), VD,
                                     lane);
  }
}

// ---------------------------------------------------------------------------------------------
// Stage 2: the state pass.

struct PassParams {
  const bf16 *w, *u, *qg, *kbar_t, *aqk;
  const float* gamma;
  const ChunkDesc* chunks;
  const SegmentDesc* segments;
  bf16* o;  // [rows, H, V] or null (no output)
  // Or null: [chunks, H, V, K], the state at each chunk start as the pass rounds it, transposed;
  // [chunks, H, V, 64], Vnew^T.
  bf16 *h_out, *vnew_out;
  int heads, vd, in_ld, out_ld;
};

// kGroups groups of 4 warps, group g carrying V slice blockIdx.z kGroups + g: the operands all
// slices read (W, Q~, Kbar^T, A_qk, gamma) are copied once per chunk for the groups together.
template <int KD, int kGroups>
__global__ void __launch_bounds__(kPassThreads* kGroups, kGroups == 1 ? 2 : 1)
    KdaStatePassKernel(PassParams p) {
  using L = StatePassSmem<KD, kGroups>;
  constexpr int SK = L::kSK, SU = L::kSU, ST = kTileStrideA, kThreads = kPassThreads * kGroups;
  constexpr int kMT = StateSlice<KD>::kMT, kNT = StateSlice<KD>::kNT;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, group = tid / kPassThreads, gtid = tid % kPassThreads;
  const int warp = gtid >> 5, lane = tid & 31, g8 = lane >> 2, t4 = lane & 3;
  unsigned char* mine = smem + L::kGroup + group * L::kGroupBytes;
  bf16* ws = reinterpret_cast<bf16*>(smem + L::kW);   // W        [64][SK]
  bf16* qs = reinterpret_cast<bf16*>(smem + L::kQ);   // Q~       [64][SK]
  bf16* kb = reinterpret_cast<bf16*>(smem + L::kKb);  // Kbar^T   [K][ST]
  bf16* as = reinterpret_cast<bf16*>(smem + L::kA);   // A_qk     [64][ST]
  float* gam = reinterpret_cast<float*>(smem + L::kGam);
  bf16* us = reinterpret_cast<bf16*>(mine + L::kSlice);  // U slice  [64][SU]
  bf16* ss = reinterpret_cast<bf16*>(mine + L::kS);      // S^T bf16 [64 cols][SK]
  bf16* vt = reinterpret_cast<bf16*>(mine + L::kVt);     // Vnew^T   [64 cols][ST]
  bf16* os = reinterpret_cast<bf16*>(mine + L::kO);      // O        [64][ST]

  const int h = blockIdx.y, heads = p.heads, vd = p.vd;
  const int slice = blockIdx.z * kGroups + group, v0 = slice * kSliceV;
  const SegmentDesc seg = p.segments[blockIdx.x];
  if (static_cast<int64_t>((blockIdx.z + 1) * kGroups) <= seg.slice_begin) return;
  // A group below slice_begin in a block that runs (K = V = 64) idles as a transition slice
  // that writes nothing: every barrier is the block's.
  const bool active = slice >= seg.slice_begin;
  const bool transition = v0 >= vd || !active;  // carries M (columns v0 - vd of the transition)
  const bool write_o = p.o != nullptr && !transition;

  // S: the slice this group carries (kda_tc_state_slice.cuh).
  StateSlice<KD> S;
  S.Init(transition, v0 - vd,
         seg.state_in != nullptr ? seg.state_in + static_cast<int64_t>(h) * KD * p.in_ld + v0
                                 : nullptr,
         p.in_ld);
  S.StoreTransposedBf16(ss, SK);
  // Stage one of a chunk's copies: W and U (what Vnew = U - W S reads first).
  auto load_wu = [&](int64_t ch) {
    const int64_t tile = ch * heads + h;
    CopyTileToShared<kChunk, KD, kThreads>(ws, SK, p.w + tile * kChunk * KD, KD, tid);
    if (!transition) {
      CopyTileToShared<kChunk, kSliceV, kPassThreads>(us, SU, p.u + tile * kChunk * vd + v0, vd,
                                                      gtid);
    }
    CpAsyncCommit();
  };
  if (seg.chunk_begin < seg.chunk_end) load_wu(seg.chunk_begin);

  for (int64_t ch = seg.chunk_begin; ch < seg.chunk_end; ++ch) {
    const int64_t tile = ch * heads + h;
    const ChunkDesc cd = p.chunks[ch];  // read at the top: its rows are needed at the end
    // The chunk's other operands; W and U are already on their way (issued for this chunk
    // while the previous one finished). The previous iteration ended with a barrier.
    if (p.o != nullptr) {
      CopyTileToShared<kChunk, KD, kThreads>(qs, SK, p.qg + tile * kChunk * KD, KD, tid);
      CopyTileToShared<kChunk, kChunk, kThreads>(as, ST, p.aqk + tile * kChunk * kChunk, kChunk,
                                                 tid);
    }
    CopyTileToShared<KD, kChunk, kThreads>(kb, ST, p.kbar_t + tile * KD * kChunk, kChunk, tid);
    for (int i = tid; i < KD / 4; i += kThreads)
      CpAsync16(gam + 4 * i, p.gamma + tile * KD + 4 * i);
    CpAsyncCommit();
    CpAsyncWaitPending<1>();  // W and U
    __syncthreads();

    // Vnew = U - W S for rows 16 warp .. 16 warp + 15, stored transposed in bf16.
    {
      float acc[kNT][4] = {};
#pragma unroll
      for (int k0 = 0; k0 < KD; k0 += 16) {
        uint32_t fa[4];
        LoadFragAx4(fa, ws + 16 * warp * SK, SK, k0);
#pragma unroll
        for (int nt = 0; nt < kNT; nt += 2) {
          uint32_t fb0[2], fb1[2];
          LoadFragBT2(fb0, fb1, ss + 8 * nt * SK, SK, k0);
          MmaBf16(acc[nt], fa, fb0);
          MmaBf16(acc[nt + 1], fa, fb1);
        }
      }
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int r = 16 * warp + g8 + (e >> 1) * 8, c = 8 * nt + 2 * t4;
          if (!transition) {
            const __nv_bfloat162 uu = *reinterpret_cast<const __nv_bfloat162*>(us + r * SU + c);
            acc[nt][e] = __low2float(uu) - acc[nt][e];
            acc[nt][e + 1] = __high2float(uu) - acc[nt][e + 1];
          } else {
            acc[nt][e] = -acc[nt][e];
            acc[nt][e + 1] = -acc[nt][e + 1];
          }
        }
      }
      // Vnew^T, one 16x16 tile per stmatrix.
#pragma unroll
      for (int nt = 0; nt < kNT; nt += 2)
        StoreTileTransposedBf16(acc[nt], acc[nt + 1], vt + 8 * nt * ST + 16 * warp, ST);
    }
    // The state at the chunk's start as rounded in shared memory (unchanged until the chunk's
    // last barrier), out transposed in whole rows behind the Vnew product.
    if (p.h_out != nullptr && !transition) {
      CopyRowsToGlobal<kSliceV, KD, kPassThreads>(ss, SK, p.h_out + (tile * vd + v0) * KD, KD,
                                                  gtid);
    }
    CpAsyncWaitPending<0>();
    __syncthreads();
    if (p.vnew_out != nullptr && !transition) {
      CopyRowsToGlobal<kSliceV, kChunk, kPassThreads>(
          vt, ST, p.vnew_out + (tile * vd + v0) * kChunk, kChunk, gtid);
    }
    // W and U are read: the next chunk's start arriving while this one finishes.
    if (ch + 1 < seg.chunk_end) load_wu(ch + 1);

    // O = Q~ S + A_qk Vnew (Q~ carries the scale), the warp's 16 rows staged in shared memory so
    // that they go out as whole 128-byte rows.
    if (write_o) {
      float acc[kNT][4] = {};
#pragma unroll
      for (int k0 = 0; k0 < KD; k0 += 16) {
        uint32_t fa[4];
        LoadFragAx4(fa, qs + 16 * warp * SK, SK, k0);
#pragma unroll
        for (int nt = 0; nt < kNT; nt += 2) {
          uint32_t fb0[2], fb1[2];
          LoadFragBT2(fb0, fb1, ss + 8 * nt * SK, SK, k0);
          MmaBf16(acc[nt], fa, fb0);
          MmaBf16(acc[nt + 1], fa, fb1);
        }
      }
      for (int kt = 0; kt <= warp; ++kt) {
        uint32_t fa[4];
        LoadFragAx4(fa, as + 16 * warp * ST, ST, 16 * kt);
#pragma unroll
        for (int nt = 0; nt < kNT; nt += 2) {
          uint32_t fb0[2], fb1[2];
          LoadFragBT2(fb0, fb1, vt + 8 * nt * ST, ST, 16 * kt);
          MmaBf16(acc[nt], fa, fb0);
          MmaBf16(acc[nt + 1], fa, fb1);
        }
      }
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int r = 16 * warp + g8 + (e >> 1) * 8, c = 8 * nt + 2 * t4;
          *reinterpret_cast<uint32_t*>(os + r * ST + c) = PackBf16(acc[nt][e], acc[nt][e + 1]);
        }
      }
      __syncwarp();
#pragma unroll
      for (int i = lane; i < 16 * kSliceV / 8; i += 32) {
        const int r = 16 * warp + i / (kSliceV / 8), c = (i % (kSliceV / 8)) * 8;
        if (r < cd.len) {
          *reinterpret_cast<uint4*>(p.o + ((cd.row_start + r) * heads + h) * vd + v0 + c) =
              *reinterpret_cast<const uint4*>(os + r * ST + c);
        }
      }
    }

    // S <- Diag(gamma) S + Kbar^T Vnew.
    S.ScaleRows(gam);
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) {
      const int d0 = warp * (KD / 4) + 16 * mi;
#pragma unroll
      for (int kt = 0; kt < kChunk / 16; ++kt) {
        uint32_t fa[4];
        LoadFragAx4(fa, kb + d0 * ST, ST, 16 * kt);
#pragma unroll
        for (int nt = 0; nt < kNT; nt += 2) {
          uint32_t fb0[2], fb1[2];
          LoadFragBT2(fb0, fb1, vt + 8 * nt * ST, ST, 16 * kt);
          MmaBf16(S.x[mi][nt], fa, fb0);
          MmaBf16(S.x[mi][nt + 1], fa, fb1);
        }
      }
    }
    __syncthreads();
    S.StoreTransposedBf16(ss, SK);
  }

  if (seg.state_out != nullptr && active) {
    S.StoreF32(seg.state_out + static_cast<int64_t>(h) * KD * p.out_ld + v0, p.out_ld);
  }
}

// ---------------------------------------------------------------------------------------------
// Stage 3: chaining the segments of each sequence, one block per (sequence, head, 32 columns).

constexpr int kCombineCols = 32;
constexpr int kCombineThreads = 256;

struct CombineParams {
  const int64_t* seq_segment_first;  // [N + 1]
  const float* ext;                  // [segments, H, K, ext_ld]: S_ext in the first V columns
  const float* trans;                // [segments, H, K, trans_ld]: M in the first K columns
  const float* h0;                   // [N, H, K, V] or null
  float* seg_start;                  // [segments, H, K, V]
  int heads, vd, ext_ld, trans_ld;
  bool backward;  // segment j's transition is trans[first + last - 1 - j] transposed
};

template <int KD>
__global__ void __launch_bounds__(kCombineThreads) KdaSegmentCombineKernel(CombineParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* m = reinterpret_cast<float*>(smem);  // [K][K]
  float* s = m + KD * KD;                     // [K][32]
  const int n = blockIdx.x / p.heads, h = blockIdx.x % p.heads, v0 = blockIdx.y * kCombineCols;
  const int tid = threadIdx.x, c = tid % kCombineCols, dg = tid / kCombineCols;
  constexpr int kRows = KD / (kCombineThreads / kCombineCols);
  const int vd = p.vd, ld = p.ext_ld, tld = p.trans_ld;
  for (int i = tid; i < KD * kCombineCols; i += kCombineThreads) {
    const int d = i / kCombineCols, j = i % kCombineCols;
    s[i] = p.h0 != nullptr ? p.h0[((static_cast<int64_t>(n) * p.heads + h) * KD + d) * vd + v0 + j]
                           : 0.0f;
  }
  __syncthreads();
  const int64_t first = p.seq_segment_first[n], last = p.seq_segment_first[n + 1];
  for (int64_t j = first; j < last; ++j) {
    float* dst = p.seg_start + (j * p.heads + h) * KD * vd;
    for (int i = tid; i < KD * kCombineCols; i += kCombineThreads) {
      dst[(i / kCombineCols) * vd + v0 + i % kCombineCols] = s[i];
    }
    if (j + 1 == last) break;
    const float* e = p.ext + (j * p.heads + h) * KD * ld;
    const float* t = p.trans + ((p.backward ? first + last - 1 - j : j) * p.heads + h) * KD * tld;
    for (int i = tid; i < KD * KD; i += kCombineThreads) m[i] = t[(i / KD) * tld + i % KD];
    __syncthreads();
    // M[d][x] = m[d K + x], or m[x K + d] transposed (either way one address across a warp).
    const int sd = p.backward ? 1 : KD, sx_stride = p.backward ? KD : 1;
    float acc[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) acc[i] = e[(dg + i * (KD / kRows)) * ld + v0 + c];
    for (int x = 0; x < KD; ++x) {
      const float sx = s[x * kCombineCols + c];
#pragma unroll
      for (int i = 0; i < kRows; ++i)
        acc[i] += m[(dg + i * (KD / kRows)) * sd + x * sx_stride] * sx;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRows; ++i) s[(dg + i * (KD / kRows)) * kCombineCols + c] = acc[i];
    __syncthreads();
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.

// A state pass over `slices` 64-column slices per (segment, head): two to a block when they
// pair up (their shared operands copied once), else one.
template <int KD>
Status LaunchStatePass(const PassParams& params, int64_t segments, int64_t heads, int slices,
                       cudaStream_t stream, const char* what) {
  const bool paired = slices % 2 == 0;
  auto kernel = paired ? KdaStatePassKernel<KD, 2> : KdaStatePassKernel<KD, 1>;
  const size_t smem = paired ? StatePassSmem<KD, 2>::kBytes : StatePassSmem<KD, 1>::kBytes;
  ORRERY_RETURN_IF_ERROR(AllowSmem(kernel, smem));
  const dim3 grid(static_cast<unsigned>(segments), static_cast<unsigned>(heads),
                  static_cast<unsigned>(paired ? slices / 2 : slices));
  kernel<<<grid, kPassThreads*(paired ? 2 : 1), smem, stream>>>(params);
  return CudaCheck(cudaGetLastError(), what);
}

template <int KD, int VD, typename GIn>
Status RunTc(const KdaProblem& p, const KdaInputs& in, const KdaTcTuning& tuning, KdaOutputs* out,
             KdaTcSaved* saved, const KdaInputTransforms* fused) {
  const int64_t n_seq = p.num_sequences(), heads = p.heads;
  // Chunk table and segments.
  std::vector<int64_t> chunk_table;  // (row_start, len) pairs
  std::vector<int64_t> seq_chunk_first = {0};
  int64_t max_chunks = 0;
  for (int64_t n = 0; n < n_seq; ++n) {
    const int64_t bos = p.seq_start[n], len = p.seq_start[n + 1] - bos;
    for (int64_t t0 = 0; t0 < len; t0 += kChunk) {
      chunk_table.push_back(bos + t0);
      chunk_table.push_back(std::min<int64_t>(kChunk, len - t0));
    }
    seq_chunk_first.push_back(static_cast<int64_t>(chunk_table.size() / 2));
    max_chunks = std::max(max_chunks, seq_chunk_first[n + 1] - seq_chunk_first[n]);
  }
  const int64_t chunks = static_cast<int64_t>(chunk_table.size() / 2);
  const int64_t segs_per_seq =
      KdaTcSegmentsPerSequence(tuning, n_seq * heads * (VD / kSliceV), max_chunks);
  const bool split = segs_per_seq > 1;

  const Device dev = p.device;
  const int64_t kd = KD, vd = VD, ck = kChunk;
  ORRERY_ASSIGN_OR_RETURN(Tensor w, Tensor::Allocate({chunks, heads, ck, kd}, DType::kBF16, dev));
  ORRERY_ASSIGN_OR_RETURN(Tensor u, Tensor::Allocate({chunks, heads, ck, vd}, DType::kBF16, dev));
  ORRERY_ASSIGN_OR_RETURN(Tensor qg, Tensor::Allocate({chunks, heads, ck, kd}, DType::kBF16, dev));
  ORRERY_ASSIGN_OR_RETURN(Tensor kbt, Tensor::Allocate({chunks, heads, kd, ck}, DType::kBF16, dev));
  ORRERY_ASSIGN_OR_RETURN(Tensor aqk, Tensor::Allocate({chunks, heads, ck, ck}, DType::kBF16, dev));
  ORRERY_ASSIGN_OR_RETURN(Tensor gamma, Tensor::Allocate({chunks, heads, kd}, DType::kF32, dev));
  ORRERY_ASSIGN_OR_RETURN(Tensor chunk_dev, Upload(chunk_table, dev));
  ORRERY_ASSIGN_OR_RETURN(const cudaStream_t stream, StreamOf(dev));
  Tensor tinv, h_saved, vnew_saved;
  if (saved != nullptr) {
    ORRERY_ASSIGN_OR_RETURN(tinv, Tensor::Allocate({chunks, heads, ck, ck}, DType::kBF16, dev));
    ORRERY_ASSIGN_OR_RETURN(h_saved, Tensor::Allocate({chunks, heads, vd, kd}, DType::kBF16, dev));
    ORRERY_ASSIGN_OR_RETURN(vnew_saved,
                            Tensor::Allocate({chunks, heads, vd, ck}, DType::kBF16, dev));
  }

  const float* h0 = in.initial_state.defined() ? in.initial_state.data<float>() : nullptr;
  float* ht = out->final_state.defined() ? out->final_state.data<float>() : nullptr;
  const int64_t state_elems = heads * kd * vd;
  // Segment tables: pass 1 (every segment but the last of its sequence, into ext; kept for the
  // backward, the last one's transition too) and the output pass. They go to the device in one
  // copy, before the first kernel (a copy between two launches would wait for the first).
  const KdaSegmentSplit segments = SplitKdaSegments(seq_chunk_first, segs_per_seq);
  const int64_t total_segs = static_cast<int64_t>(segments.ranges.size());
  Tensor ext, seg_start;
  if (split) {
    ORRERY_ASSIGN_OR_RETURN(ext,
                            Tensor::Allocate({total_segs, heads, kd, vd + kd}, DType::kF32, dev));
    ORRERY_ASSIGN_OR_RETURN(seg_start,
                            Tensor::Allocate({total_segs, heads, kd, vd}, DType::kF32, dev));
  }
  std::vector<int64_t> pass1, pass2;
  for (int64_t n = 0; n < n_seq; ++n) {
    const int64_t first = segments.seq_first[n], last = segments.seq_first[n + 1] - 1;
    for (int64_t s = first; s <= last; ++s) {
      const auto range = segments.ranges[s];
      if (!split) {
        AppendSegmentDesc(&pass2, range, h0 != nullptr ? h0 + n * state_elems : nullptr,
                          ht != nullptr ? ht + n * state_elems : nullptr);
        continue;
      }
      float* ext_s = ext.data<float>() + s * heads * kd * (vd + kd);
      if (s < last) {
        AppendSegmentDesc(&pass1, range, nullptr, ext_s);
      } else if (saved != nullptr && first < last) {
        AppendSegmentDesc(&pass1, range, nullptr, ext_s, VD / kSliceV);
      }
      AppendSegmentDesc(&pass2, range, seg_start.data<float>() + s * state_elems,
                        s == last && ht != nullptr ? ht + n * state_elems : nullptr);
    }
  }
  ORRERY_ASSIGN_OR_RETURN(const KdaSegmentTables tables,
                          UploadKdaSegmentTables(pass2, pass1, segments.seq_first, dev));

  // Stage 1.
  if (chunks > 0) {
    PrepParams<GIn> pp;
    pp.q = static_cast<const bf16*>(in.q.raw_data());
    pp.k = static_cast<const bf16*>(in.k.raw_data());
    pp.v = static_cast<const bf16*>(in.v.raw_data());
    pp.beta = static_cast<const bf16*>(in.beta.raw_data());
    pp.g = static_cast<const GIn*>(in.g.raw_data());
    pp.chunks = reinterpret_cast<const ChunkDesc*>(chunk_dev.data<int64_t>());
    pp.w = static_cast<bf16*>(w.raw_data());
    pp.u = static_cast<bf16*>(u.raw_data());
    pp.qg = static_cast<bf16*>(qg.raw_data());
    pp.kbar_t = static_cast<bf16*>(kbt.raw_data());
    pp.aqk = static_cast<bf16*>(aqk.raw_data());
    pp.gamma = gamma.data<float>();
    pp.tinv = saved != nullptr ? static_cast<bf16*>(tinv.raw_data()) : nullptr;
    pp.heads = static_cast<int>(heads);
    pp.scale = p.scale;
    if (fused != nullptr) pp.tr = MakeChunkInputTransforms(*fused, in);
    const size_t smem = PrepSmem<KD, VD>::kBytes;
    auto kernel = fused != nullptr ? KdaChunkPrepKernel<KD, VD, GIn, true>
                                   : KdaChunkPrepKernel<KD, VD, GIn, false>;
    ORRERY_RETURN_IF_ERROR(AllowSmem(kernel, smem));
    kernel<<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(heads)), kPrepThreads, smem,
             stream>>>(pp);
    ORRERY_RETURN_IF_ERROR(CudaCheck(cudaGetLastError(), "chunk prep kernel launch"));
  }

  if (tuning.prep_only) return Status::OK();
  PassParams pass;
  pass.w = static_cast<const bf16*>(w.raw_data());
  pass.u = static_cast<const bf16*>(u.raw_data());
  pass.qg = static_cast<const bf16*>(qg.raw_data());
  pass.kbar_t = static_cast<const bf16*>(kbt.raw_data());
  pass.aqk = static_cast<const bf16*>(aqk.raw_data());
  pass.gamma = gamma.data<float>();
  pass.chunks = reinterpret_cast<const ChunkDesc*>(chunk_dev.data<int64_t>());
  pass.h_out = nullptr;
  pass.vnew_out = nullptr;
  pass.heads = static_cast<int>(heads);
  pass.vd = VD;
  if (!pass1.empty()) {
    PassParams p1 = pass;
    p1.segments = tables.first_pass;
    p1.o = nullptr;
    p1.in_ld = VD;
    p1.out_ld = VD + KD;
    ORRERY_RETURN_IF_ERROR(LaunchStatePass<KD>(p1, pass1.size() / kSegmentDescWords, heads,
                                               (VD + KD) / kSliceV, stream, "state pass 1 launch"));
  }
  if (split) {
    SegmentCombineArgs combine;
    combine.seq_segment_first = tables.seq_segment_first;
    combine.ext = ext.data<float>();
    combine.ext_ld = vd + kd;
    combine.trans = ext.data<float>() + vd;
    combine.trans_ld = vd + kd;
    combine.init = h0;
    combine.seg_start = seg_start.data<float>();
    combine.device = dev;
    ORRERY_RETURN_IF_ERROR(LaunchKdaSegmentCombine(KD, VD, n_seq, heads, combine));
  }
  PassParams p2 = pass;
  p2.segments = tables.output_pass;
  p2.o = out->o.defined() ? static_cast<bf16*>(out->o.raw_data()) : nullptr;
  if (saved != nullptr) {
    p2.h_out = static_cast<bf16*>(h_saved.raw_data());
    p2.vnew_out = static_cast<bf16*>(vnew_saved.raw_data());
  }
  p2.in_ld = VD;
  p2.out_ld = VD;
  ORRERY_RETURN_IF_ERROR(LaunchStatePass<KD>(p2, pass2.size() / kSegmentDescWords, heads,
                                             VD / kSliceV, stream, "state pass launch"));
  // The scratch tensors and tables go back to the device's block cache when this returns, while
  // the kernels may still run: whatever takes those blocks next is queued after them on the
  // same stream.
  if (saved != nullptr) {
    saved->chunk_table = std::move(chunk_dev);
    saved->seq_chunk_first = std::move(seq_chunk_first);
    saved->chunks = chunks;
    saved->max_chunks = max_chunks;
    saved->w = std::move(w);
    saved->qg = std::move(qg);
    saved->kbar_t = std::move(kbt);
    saved->aqk = std::move(aqk);
    saved->gamma = std::move(gamma);
    saved->tinv = std::move(tinv);
    saved->h = std::move(h_saved);
    saved->vnew = std::move(vnew_saved);
    saved->segments_per_sequence = segs_per_seq;
    saved->transitions = std::move(ext);
  }
  return Status::OK();
}

template <typename GIn>
Status DispatchTc(const KdaProblem& p, const KdaInputs& in, const KdaTcTuning& tuning,
                  KdaOutputs* out, KdaTcSaved* saved, const KdaInputTransforms* fused) {
  if (p.key_dim == 128 && p.value_dim == 128) {
    return RunTc<128, 128, GIn>(p, in, tuning, out, saved, fused);
  }
  if (p.key_dim == 128 && p.value_dim == 64)
    return RunTc<128, 64, GIn>(p, in, tuning, out, saved, fused);
  if (p.key_dim == 64 && p.value_dim == 128)
    return RunTc<64, 128, GIn>(p, in, tuning, out, saved, fused);
  return RunTc<64, 64, GIn>(p, in, tuning, out, saved, fused);
}

}  // namespace

int64_t KdaTcSegmentsPerSequence(const KdaTcTuning& tuning, int64_t blocks, int64_t max_chunks) {
  int64_t segs_per_seq = tuning.segments_per_sequence;
  if (segs_per_seq <= 0) {
    int sms = 132;
    int dev = 0;
    if (cudaGetDevice(&dev) == cudaSuccess) {
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    }
    // Split when the plain pass would leave most of the chip idle (fewer blocks than SMs):
    // as many segments as keep the output pass within one wave of 2 blocks per SM, each of at
    // least 16 chunks. Measured on the H200 (docs/benchmarks.md): 32 blocks gain most from 8
    // segments (9 put the backward's output pass past one wave: forward + backward 9.89 against
    // 8.73 ms at 1 x 65536 x 16), 192 and 256 blocks lose from any split (the first pass costs
    // more than the idle SMs).
    segs_per_seq = 1;
    if (blocks > 0 && blocks < sms) {
      segs_per_seq = std::min<int64_t>(2 * sms / blocks, max_chunks / 16);
      segs_per_seq = std::max<int64_t>(segs_per_seq, 1);
    }
  }
  return std::min<int64_t>(segs_per_seq, std::max<int64_t>(max_chunks, 1));
}

Status LaunchKdaSegmentCombine(int64_t kd, int64_t vd, int64_t n_seq, int64_t heads,
                               const SegmentCombineArgs& args) {
  CombineParams cp;
  cp.seq_segment_first = args.seq_segment_first;
  cp.ext = args.ext;
  cp.trans = args.trans;
  cp.h0 = args.init;
  cp.seg_start = args.seg_start;
  cp.heads = static_cast<int>(heads);
  cp.vd = static_cast<int>(vd);
  cp.ext_ld = static_cast<int>(args.ext_ld);
  cp.trans_ld = static_cast<int>(args.trans_ld);
  cp.backward = args.backward;
  const size_t smem = sizeof(float) * (kd * kd + kd * kCombineCols);
  auto kernel = kd == 128 ? KdaSegmentCombineKernel<128> : KdaSegmentCombineKernel<64>;
  ORRERY_RETURN_IF_ERROR(AllowSmem(kernel, smem));
  ORRERY_ASSIGN_OR_RETURN(const cudaStream_t stream, StreamOf(args.device));
  kernel<<<dim3(static_cast<unsigned>(n_seq * heads), static_cast<unsigned>(vd / kCombineCols)),
           kCombineThreads, smem, stream>>>(cp);
  return CudaCheck(cudaGetLastError(), "segment combine launch");
}

bool KdaTcSupported(const KdaProblem& p, const KdaInputs& in) {
  // The kernels read q, k, v and g rows and dt_bias (the fused gate's) in 16-byte pieces.
  auto aligned = [](const Tensor& t) {
    return !t.defined() || reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0;
  };
  return p.dtype == DType::kBF16 && (p.key_dim == 64 || p.key_dim == 128) &&
         (p.value_dim == 64 || p.value_dim == 128) &&
         (in.g.dtype() == DType::kF32 || in.g.dtype() == DType::kBF16) && aligned(in.q) &&
         aligned(in.k) && aligned(in.v) && aligned(in.g) && aligned(in.dt_bias);
}

Status LaunchKdaForwardTc(const KdaProblem& p, const KdaInputs& in, const KdaTcTuning& tuning,
                          KdaOutputs* out, KdaTcSaved* saved, const KdaInputTransforms* fused) {
  if (!KdaTcSupported(p, in)) {
    return UnimplementedError(
        "kda cuda: the tensor-core forward needs bf16 q/k/v/beta and "
        "K, V in {64, 128}; got " +
        std::string(DTypeName(p.dtype)) + " K = " + std::to_string(p.key_dim) +
        " V = " + std::to_string(p.value_dim));
  }
  if (in.g.dtype() == DType::kF32) return DispatchTc<float>(p, in, tuning, out, saved, fused);
  return DispatchTc<bf16>(p, in, tuning, out, saved, fused);
}

}  // namespace orrery::kernels::cuda
