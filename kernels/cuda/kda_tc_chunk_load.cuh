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

// Scales the 8 bf16 of `v` by 1 / sqrt(sum of squares over the row + eps), the row being the
// kLanes consecutive lanes that hold its 16-byte pieces (all lanes of the warp call this); that
// factor goes to *rstd when given.
template <int kLanes>
__device__ __forceinline__ uint4 NormalisePiece(uint4 v, float eps, float* rstd = nullptr) {
  __nv_bfloat162* x = reinterpret_cast<__nv_bfloat162*>(&v);
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(x[j]);
    ss += f.x * f.x + f.y * f.y;
  }
#pragma unroll
  for (int o = 1; o < kLanes; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float r = rsqrtf(ss + eps);
  if (rstd != nullptr) *rstd = r;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(x[j]);
    x[j] = __floats2bfloat162_rn(f.x * r, f.y * r);
  }
  return v;
}

// One chunk's gate, [64][K] (rows past the chunk's end: zeros), as 16-byte pieces in the
// registers of the kThreads threads of a block: what FetchChunkGate loads and StoreChunkGate puts
// into shared memory, apart so that other work can run while the loads are in flight.
template <int KD, int kThreads>
struct ChunkGatePieces {
  static constexpr int kPer = kTcChunk * KD / 4 / kThreads;
  static_assert(kTcChunk * KD / 4 % kThreads == 0, "every thread the same number of pieces");
  float4 v[kPer];
};

// Issues the loads of one chunk's gate (every thread of the block; global rows 16-byte aligned).
template <int KD, int kThreads, typename GIn>
__device__ __forceinline__ void FetchChunkGate(ChunkGatePieces<KD, kThreads>& gp, const GIn* g,
                                               const ChunkDesc& cd, int heads, int h) {
#pragma unroll
  for (int it = 0; it < gp.kPer; ++it) {
    const int i = threadIdx.x + it * kThreads, r = i / (KD / 4), d = (i % (KD / 4)) * 4;
    gp.v[it] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < cd.len) gp.v[it] = LoadF4(g + ((cd.row_start + r) * heads + h) * KD + d);
  }
}

// Stores fetched gate pieces into G ([64][sg] floats, sg a multiple of 4) and forms the
// chunk-local cumulative gate in log2 in place, G[r][d] = log2(e) * sum_{i <= r} g[i][d] (rows past
// the end add zeros, so G stays flat there). With tr->gate the pieces hold the gate's
// pre-activation z and are activated first. Needs kThreads >= 2 K (the cumsum runs two 32-row
// halves in parallel, then adds the first half's total to the second). Ends with a barrier.
template <int KD, int kThreads>
__device__ __forceinline__ void StoreChunkGate(float* G, int sg,
                                               const ChunkGatePieces<KD, kThreads>& gp,
                                               const ChunkDesc& cd, int h,
                                               const ChunkInputTransforms* tr = nullptr) {
  static_assert(kThreads >= 2 * KD, "one thread per column and half chunk");
  const int tid = threadIdx.x;
  // A thread's pieces all sit in columns d0 .. d0 + 3, so one dt_bias piece serves them all.
  static_assert(kThreads % (KD / 4) == 0, "a thread's g pieces share their columns");
  const bool gate = tr != nullptr && tr->gate;
  const int d0 = (tid % (KD / 4)) * 4;
  const float ea = gate && tr->a_log != nullptr ? __expf(tr->a_log[h]) : 1.0f;
  const float4 bias = gate && tr->dt_bias != nullptr
                          ? *reinterpret_cast<const float4*>(tr->dt_bias + h * KD + d0)
                          : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (gate && tr->bounded) {
    // The bounded gate (the K3 form), activated in registers on the way to shared memory, the
    // loop unrolled: its code is short (two special-function operations an element).
#pragma unroll
    for (int it = 0; it < gp.kPer; ++it) {
      const int r = (tid + it * kThreads) / (KD / 4);
      float4 v = gp.v[it];
      if (r < cd.len) {  // rows past the end stay zero
        v.x = KdaGateValue(v.x + bias.x, ea, true, tr->g_min);
        v.y = KdaGateValue(v.y + bias.y, ea, true, tr->g_min);
        v.z = KdaGateValue(v.z + bias.z, ea, true, tr->g_min);
        v.w = KdaGateValue(v.w + bias.w, ea, true, tr->g_min);
      }
      *reinterpret_cast<float4*>(G + r * sg + d0) = v;
    }
  } else {
#pragma unroll
    for (int it = 0; it < gp.kPer; ++it) {
      const int r = (tid + it * kThreads) / (KD / 4);
      *reinterpret_cast<float4*>(G + r * sg + d0) = gp.v[it];
    }
  }
  if (gate && !tr->bounded) {
    // The original gate in place, on the pieces this thread stored (no barrier needed), in a loop
    // that is not unrolled: unrolled, its transcendental code (softplus) filled the instruction
    // cache (the in-op transforms forward measured 2.8 -> 3.4 ms unrolled).
#pragma unroll 1
    for (int it = 0; it < gp.kPer; ++it) {
      const int r = (tid + it * kThreads) / (KD / 4);
      if (r >= cd.len) break;  // rows past the end stay zero
      float4* x = reinterpret_cast<float4*>(G + r * sg + d0);
      float4 v = *x;
      v.x = KdaGateValue(v.x + bias.x, ea, false, tr->g_min);
      v.y = KdaGateValue(v.y + bias.y, ea, false, tr->g_min);
      v.z = KdaGateValue(v.z + bias.z, ea, false, tr->g_min);
      v.w = KdaGateValue(v.w + bias.w, ea, false, tr->g_min);
      *x = v;
    }
  }
  __syncthreads();
  if (tid < 2 * KD) {
    const int d = tid % KD, r0 = (tid / KD) * (kTcChunk / 2);
    float acc = 0.0f;
    for (int r = r0; r < r0 + kTcChunk / 2; ++r) {
      acc += G[r * sg + d] * kLog2e;
      G[r * sg + d] = acc;
    }
  }
  __syncthreads();
  for (int i = tid; i < kTcChunk / 2 * KD; i += kThreads) {
    const int r = kTcChunk / 2 + i / KD, d = i % KD;
    G[r * sg + d] += G[(kTcChunk / 2 - 1) * sg + d];
  }
  __syncthreads();
}

// The L2 norm of LoadChunkQKGate (the same pieces on the same lanes) on q and k rows already in
// shared memory ([64][K] bf16, `stride` elements per row), in place, with each row's
// 1 / sqrt(sum x^2 + eps) into q_rstd[r] and k_rstd[r] (what the backward's chain rule needs).
// The rows must be visible to every thread (a barrier before); one must follow.
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

// One 64-token chunk of q, k and the gate into shared memory: q and k rows [64][K] (bf16,
// `stride` elements per shared row, a multiple of 8; rows past the chunk's end are zeros) and the
// gate's cumsum G as StoreChunkGate forms it. Every global load is issued before the first shared
// store, so the chunk costs one memory round trip, not one per loop iteration (a block per SM or
// two cannot hide them otherwise). Global rows must be 16-byte aligned (KdaTcSupported checks the
// bases). With tr->qk_l2norm each row of q and k is normalised as it loads (a row's K / 8 pieces
// are on consecutive lanes of one warp); with tr->gate, g holds the gate's pre-activation z. Ends
// with a barrier.
template <int KD, int kThreads, typename GIn>
__device__ __forceinline__ void LoadChunkQKGate(__nv_bfloat16* qs, __nv_bfloat16* ks, int stride,
                                                float* G, int sg, const __nv_bfloat16* q,
                                                const __nv_bfloat16* k, const GIn* g,
                                                const ChunkDesc& cd, int heads, int h,
                                                const ChunkInputTransforms* tr = nullptr) {
  constexpr int kQkPieces = kTcChunk * KD / 8;
  static_assert(32 % (KD / 8) == 0 && kQkPieces % kThreads == 0,
                "a row's pieces in one warp, every thread the same number of pieces");
  constexpr int kQkPer = kQkPieces / kThreads;
  const int tid = threadIdx.x;
  // Fetch: 2 kQkPer + the gate's pieces in flight per thread.
  uint4 qv[kQkPer], kv[kQkPer];
#pragma unroll
  for (int it = 0; it < kQkPer; ++it) {
    const int i = tid + it * kThreads, r = i / (KD / 8), c = (i % (KD / 8)) * 8;
    qv[it] = kv[it] = make_uint4(0, 0, 0, 0);
    if (r < cd.len) {
      const int64_t off = ((cd.row_start + r) * heads + h) * KD + c;
      qv[it] = *reinterpret_cast<const uint4*>(q + off);
      kv[it] = *reinterpret_cast<const uint4*>(k + off);
    }
  }
  ChunkGatePieces<KD, kThreads> gp;
  FetchChunkGate<KD, kThreads>(gp, g, cd, heads, h);
  // Store, transforming on the way.
#pragma unroll
  for (int it = 0; it < kQkPer; ++it) {
    const int i = tid + it * kThreads, r = i / (KD / 8), c = (i % (KD / 8)) * 8;
    if (tr != nullptr && tr->qk_l2norm) {
      qv[it] = NormalisePiece<KD / 8>(qv[it], tr->eps);
      kv[it] = NormalisePiece<KD / 8>(kv[it], tr->eps);
    }
    *reinterpret_cast<uint4*>(qs + r * stride + c) = qv[it];
    *reinterpret_cast<uint4*>(ks + r * stride + c) = kv[it];
  }
  StoreChunkGate<KD, kThreads>(G, sg, gp, cd, h, tr);
}

// beta K 2^G of the loaded chunk into dst[r * stride + d] (bf16; dst may be q's rows once q is
// dead), four columns per thread and step. bs holds beta per row.
template <int KD, int kThreads>
__device__ __forceinline__ void StoreBetaKExpG(__nv_bfloat16* dst, const __nv_bfloat16* ks,
                                               int stride, const float* G, int sg,
                                               const float* bs) {
  for (int i = threadIdx.x; i < kTcChunk * KD / 4; i += kThreads) {
    const int r = i / (KD / 4), d = (i % (KD / 4)) * 4;
    const float4 g = *reinterpret_cast<const float4*>(G + r * sg + d);
    const uint2 kr = *reinterpret_cast<const uint2*>(ks + r * stride + d);
    const float2 k01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&kr.x));
    const float2 k23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&kr.y));
    const float b = bs[r];
    *reinterpret_cast<uint2*>(dst + r * stride + d) =
        make_uint2(PackBf16(b * k01.x * Exp2Ftz(g.x), b * k01.y * Exp2Ftz(g.y)),
                   PackBf16(b * k23.x * Exp2Ftz(g.z), b * k23.y * Exp2Ftz(g.w)));
  }
}

}  // namespace orrery::kernels::cuda
