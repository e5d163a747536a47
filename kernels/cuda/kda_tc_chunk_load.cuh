// Loading one 64-token chunk of one head into shared memory, and the operand both users form
// from it first (beta K 2^G), shared by the tensor-core kernels that work per (chunk, head): the
// forward's chunk preparation (kda_forward_tc.cu) and the backward's chunk kernel
// (kda_backward_tc.cu). Every thread of the block calls these.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/kda_cuda_util.cuh"
#include "kernels/cuda/kda_mma.cuh"
#include "kernels/cuda/kda_tc_layout.cuh"

namespace orrery::kernels::cuda {

// beta of one row as the recurrence takes it (tr null: as given).
template <typename In>
__device__ __forceinline__ float LoadBeta(const In* beta, const ChunkInputTransforms* tr) {
  const float b = LoadF(beta);
  return tr != nullptr && tr->beta_sigmoid ? SigmoidF(b) : b;
}

// Scales the bf16 of `v` (8 in a uint4, 4 in a uint2) by 1 / sqrt(sum of squares over the row
// + eps), the row being the kLanes consecutive lanes that hold its pieces (all lanes of the warp
// call this); that factor goes to *rstd when given.
template <int kLanes, typename Piece>
__device__ __forceinline__ Piece NormalisePiece(Piece v, float eps, float* rstd = nullptr) {
  constexpr int kPairs = sizeof(Piece) / sizeof(__nv_bfloat162);
  __nv_bfloat162* x = reinterpret_cast<__nv_bfloat162*>(&v);
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const float2 f = __bfloat1622float2(x[j]);
    ss += f.x * f.x + f.y * f.y;
  }
#pragma unroll
  for (int o = 1; o < kLanes; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float r = rsqrtf(ss + eps);
  if (rstd != nullptr) *rstd = r;
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const float2 f = __bfloat1622float2(x[j]);
    x[j] = __floats2bfloat162_rn(f.x * r, f.y * r);
  }
  return v;
}

// How a block's kThreads threads hold one chunk's [64][K] rows in registers: thread t holds the
// four columns 4 (t % kLanesPerRow) .. + 3 of the kPer consecutive rows of segment
// t / kLanesPerRow (so that the gate's cumsum runs down its own rows in registers first); in each
// step a warp reads 32 / kLanesPerRow whole rows.
template <int KD, int kThreads>
struct ChunkRowMap {
  static constexpr int kLanesPerRow = KD / 4;
  static constexpr int kSegments = kThreads / kLanesPerRow;
  static constexpr int kPer = kTcChunk / kSegments;
  static_assert(kThreads % kLanesPerRow == 0 && kTcChunk % kSegments == 0 && 32 % kLanesPerRow == 0,
                "whole rows per warp, every thread the same number of rows");
  __device__ static int Row0() { return threadIdx.x / kLanesPerRow * kPer; }
  __device__ static int Col0() { return threadIdx.x % kLanesPerRow * 4; }
};

// One chunk's gate (rows past the chunk's end: zeros) in ChunkRowMap's registers: what
// FetchChunkGate loads and StoreChunkGate turns into the cumsum G, apart so that other work can
// run while the loads are in flight.
template <int KD, int kThreads>
struct ChunkGatePieces : ChunkRowMap<KD, kThreads> {
  float4 v[ChunkRowMap<KD, kThreads>::kPer];
};

// One chunk's q and k rows (bf16; rows past the chunk's end: zeros) in ChunkRowMap's registers.
template <int KD, int kThreads>
struct ChunkQKPieces : ChunkRowMap<KD, kThreads> {
  uint2 q[ChunkRowMap<KD, kThreads>::kPer], k[ChunkRowMap<KD, kThreads>::kPer];
};

// Issues the loads of one chunk's gate (every thread of the block; global rows 16-byte aligned).
template <int KD, int kThreads, typename GIn>
__device__ __forceinline__ void FetchChunkGate(ChunkGatePieces<KD, kThreads>& gp, const GIn* g,
                                               const ChunkDesc& cd, int heads, int h) {
  const int r0 = gp.Row0();
  const GIn* src = g + ((cd.row_start + r0) * heads + h) * KD + gp.Col0();
#pragma unroll
  for (int it = 0; it < gp.kPer; ++it) {
    gp.v[it] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r0 + it < cd.len) gp.v[it] = LoadF4(src);
    src += static_cast<int64_t>(heads) * KD;
  }
}

// Stores fetched gate pieces into G ([64][sg] floats, sg a multiple of 4) as the chunk-local
// cumulative gate in log2, G[r][d] = log2(e) * sum_{i <= r} g[i][d] (rows past the end add zeros,
// so G stays flat there). With tr->gate the pieces hold the gate's pre-activation z and are
// activated first. The cumsum runs down each thread's own rows in registers; then each thread
// adds the totals of the segments above its own, read from their last rows (until 2026-12 it was
// one serial shared-memory chain of 32 rows per column). The thread's values of G stay in gp.v.
// Ends with a barrier.
template <int KD, int kThreads>
__device__ __forceinline__ void StoreChunkGate(float* G, int sg, ChunkGatePieces<KD, kThreads>& gp,
                                               const ChunkDesc& cd, int h,
                                               const ChunkInputTransforms* tr = nullptr) {
  using Pieces = ChunkGatePieces<KD, kThreads>;
  constexpr int kPer = Pieces::kPer;
  const int r0 = gp.Row0(), d0 = gp.Col0(), segment = threadIdx.x / Pieces::kLanesPerRow;
  const bool gate = tr != nullptr && tr->gate;
  // All of a thread's pieces sit in columns d0 .. d0 + 3, so one dt_bias piece serves them all.
  const float ea = gate && tr->a_log != nullptr ? __expf(tr->a_log[h]) : 1.0f;
  const float4 bias = gate && tr->dt_bias != nullptr
                          ? *reinterpret_cast<const float4*>(tr->dt_bias + h * KD + d0)
                          : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 v[kPer];
#pragma unroll
  for (int it = 0; it < kPer; ++it) v[it] = gp.v[it];
  if (gate && tr->bounded) {
    // The bounded gate (the K3 form), activated in registers, the loop unrolled: its code is
    // short (two special-function operations an element).
#pragma unroll
    for (int it = 0; it < kPer; ++it) {
      if (r0 + it < cd.len) {  // rows past the end stay zero
        v[it].x = KdaGateValue(v[it].x + bias.x, ea, true, tr->g_min);
        v[it].y = KdaGateValue(v[it].y + bias.y, ea, true, tr->g_min);
        v[it].z = KdaGateValue(v[it].z + bias.z, ea, true, tr->g_min);
        v[it].w = KdaGateValue(v[it].w + bias.w, ea, true, tr->g_min);
      }
    }
  } else if (gate) {
    // The original gate in place in G, on this thread's own pieces (no barrier needed), in a loop
    // that is not unrolled: unrolled, its transcendental code (softplus) filled the instruction
    // cache (the in-op transforms forward measured 2.8 -> 3.4 ms unrolled). Then back.
#pragma unroll
    for (int it = 0; it < kPer; ++it) *reinterpret_cast<float4*>(G + (r0 + it) * sg + d0) = v[it];
#pragma unroll 1
    for (int it = 0; it < kPer; ++it) {
      if (r0 + it >= cd.len) break;  // rows past the end stay zero
      float4* x = reinterpret_cast<float4*>(G + (r0 + it) * sg + d0);
      float4 y = *x;
      y.x = KdaGateValue(y.x + bias.x, ea, false, tr->g_min);
      y.y = KdaGateValue(y.y + bias.y, ea, false, tr->g_min);
      y.z = KdaGateValue(y.z + bias.z, ea, false, tr->g_min);
      y.w = KdaGateValue(y.w + bias.w, ea, false, tr->g_min);
      *x = y;
    }
#pragma unroll
    for (int it = 0; it < kPer; ++it)
      v[it] = *reinterpret_cast<const float4*>(G + (r0 + it) * sg + d0);
  }
  // The cumsum down the thread's own rows; the last one is its segment's total.
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int it = 0; it < kPer; ++it) {
    acc.x += v[it].x * kLog2e;
    acc.y += v[it].y * kLog2e;
    acc.z += v[it].z * kLog2e;
    acc.w += v[it].w * kLog2e;
    v[it] = acc;
    *reinterpret_cast<float4*>(G + (r0 + it) * sg + d0) = acc;
  }
  __syncthreads();
  // The totals of the segments above, in order (independent loads: one round trip).
  float4 off = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int s = 0; s < Pieces::kSegments - 1; ++s) {
    if (s < segment) {
      const float4 t = *reinterpret_cast<const float4*>(G + (s * kPer + kPer - 1) * sg + d0);
      off.x += t.x;
      off.y += t.y;
      off.z += t.z;
      off.w += t.w;
    }
  }
  __syncthreads();
#pragma unroll
  for (int it = 0; it < kPer; ++it) {
    gp.v[it] = make_float4(v[it].x + off.x, v[it].y + off.y, v[it].z + off.z, v[it].w + off.w);
    *reinterpret_cast<float4*>(G + (r0 + it) * sg + d0) = gp.v[it];
  }
  __syncthreads();
}

// The L2 norm of LoadChunkQKGate on q and k rows already in shared memory ([64][K] bf16, `stride`
// elements per row), in place, with each row's 1 / sqrt(sum x^2 + eps) into q_rstd[r] and
// k_rstd[r] (what the backward's chain rule needs). Its pieces are 8 columns on K / 8 lanes;
// LoadChunkQKGate's are 4 columns on K / 4 lanes since 281877e, so a row's sum of squares is
// associated differently and can differ from the forward's in its last bit (a normalised element
// then by one bf16 rounding, well inside the gradients' tolerances). The rows must be visible to
// every thread (a barrier before); one must follow.
template <int KD, int kThreads>
__device__ __forceinline__ void NormaliseChunkQK(__nv_bfloat16* qs, __nv_bfloat16* ks, int stride,
                                                 float* q_rstd, float* k_rstd, float eps) {
  constexpr int kPer = kTcChunk * KD / 8 / kThreads;
  static_assert(32 % (KD / 8) == 0 && kTcChunk * KD / 8 % kThreads == 0,
                "a row's pieces in one warp, every thread the same number of pieces");
#pragma unroll 1  // shared-memory operands only: nothing to overlap, and less code
  for (int it = 0; it < kPer; ++it) {
    const int i = threadIdx.x + it * kThreads, r = i / (KD / 8), c = (i % (KD / 8)) * 8;
    uint4* qp = reinterpret_cast<uint4*>(qs + r * stride + c);
    uint4* kp = reinterpret_cast<uint4*>(ks + r * stride + c);
    float rq, rk;
    *qp = NormalisePiece<KD / 8>(*qp, eps, &rq);
    *kp = NormalisePiece<KD / 8>(*kp, eps, &rk);
    if (c == 0) {
      q_rstd[r] = rq;
      k_rstd[r] = rk;
    }
  }
}

// One 64-token chunk of q, k and the gate into shared memory and ChunkRowMap's registers: q and k
// rows [64][K] (bf16, `stride` elements per shared row, a multiple of 4; rows past the chunk's end
// are zeros), also left in qk, and the gate's cumsum G as StoreChunkGate forms it, also left in gp.
// Every global load is issued before the first shared store, so the chunk costs one memory round
// trip, not one per loop iteration (a block per SM or two cannot hide them otherwise). Global rows
// must be 16-byte aligned (KdaTcSupported checks the bases). With tr->qk_l2norm each row of q and
// k is normalised as it loads (a row's K / 4 pieces are on consecutive lanes of one warp); with
// tr->gate, g holds the gate's pre-activation z. Ends with a barrier.
template <int KD, int kThreads, typename GIn>
__device__ __forceinline__ void LoadChunkQKGate(__nv_bfloat16* qs, __nv_bfloat16* ks, int stride,
                                                float* G, int sg, ChunkQKPieces<KD, kThreads>& qk,
                                                ChunkGatePieces<KD, kThreads>& gp,
                                                const __nv_bfloat16* q, const __nv_bfloat16* k,
                                                const GIn* g, const ChunkDesc& cd, int heads, int h,
                                                const ChunkInputTransforms* tr = nullptr) {
  constexpr int kPer = ChunkRowMap<KD, kThreads>::kPer;
  const int r0 = qk.Row0(), d0 = qk.Col0();
  // Fetch: 2 kPer pieces of q and k and the gate's kPer in flight per thread.
  int64_t off = ((cd.row_start + r0) * heads + h) * KD + d0;
#pragma unroll
  for (int it = 0; it < kPer; ++it) {
    qk.q[it] = qk.k[it] = make_uint2(0, 0);
    if (r0 + it < cd.len) {
      qk.q[it] = *reinterpret_cast<const uint2*>(q + off);
      qk.k[it] = *reinterpret_cast<const uint2*>(k + off);
    }
    off += static_cast<int64_t>(heads) * KD;
  }
  FetchChunkGate<KD, kThreads>(gp, g, cd, heads, h);
  // Store, transforming on the way.
#pragma unroll
  for (int it = 0; it < kPer; ++it) {
    if (tr != nullptr && tr->qk_l2norm) {
      qk.q[it] = NormalisePiece<KD / 4>(qk.q[it], tr->eps);
      qk.k[it] = NormalisePiece<KD / 4>(qk.k[it], tr->eps);
    }
    *reinterpret_cast<uint2*>(qs + (r0 + it) * stride + d0) = qk.q[it];
    *reinterpret_cast<uint2*>(ks + (r0 + it) * stride + d0) = qk.k[it];
  }
  StoreChunkGate<KD, kThreads>(G, sg, gp, cd, h, tr);
}

// beta K 2^G of the loaded chunk into dst[r * stride + d] (bf16; dst may be q's rows once q is
// dead), four columns per thread and step, each thread the same columns down every
// kThreads / (K / 4)-th row. bs holds beta per row.
template <int KD, int kThreads>
__device__ __forceinline__ void StoreBetaKExpG(__nv_bfloat16* dst, const __nv_bfloat16* ks,
                                               int stride, const float* G, int sg,
                                               const float* bs) {
  constexpr int kPieces = KD / 4, kRowStep = kThreads / kPieces;
  static_assert(kThreads % kPieces == 0 && kTcChunk % kRowStep == 0, "whole rows per step");
  const int d = threadIdx.x % kPieces * 4, r0 = threadIdx.x / kPieces;
#pragma unroll
  for (int it = 0; it < kTcChunk / kRowStep; ++it) {
    const int r = r0 + it * kRowStep;
    const float4 g = *reinterpret_cast<const float4*>(G + r * sg + d);
    const uint2 kr = *reinterpret_cast<const uint2*>(ks + r * stride + d);
    const float2 k01 = UnpackBf16x2(kr.x), k23 = UnpackBf16x2(kr.y);
    const float b = bs[r];
    *reinterpret_cast<uint2*>(dst + r * stride + d) =
        make_uint2(PackBf16(b * k01.x * Exp2Ftz(g.x), b * k01.y * Exp2Ftz(g.y)),
                   PackBf16(b * k23.x * Exp2Ftz(g.z), b * k23.y * Exp2Ftz(g.w)));
  }
}

}  // namespace orrery::kernels::cuda
