// Loading one 64-token chunk of one head into shared memory, shared by the tensor-core kernels
// that work per (chunk, head): the forward's chunk preparation (kda_forward_tc.cu) and the
// backward's K-side kernel (kda_backward_tc.cu). Every thread of the block calls these.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/kda_tc_layout.cuh"

namespace orrery::kernels::cuda {

// q and k rows [64][K] (bf16, `stride` elements per shared row, a multiple of 8); rows past the
// chunk's end are zeros. Global rows must be 16-byte aligned (KdaTcSupported checks the bases).
template <int KD, int kThreads>
__device__ __forceinline__ void LoadChunkQK(__nv_bfloat16* qs, __nv_bfloat16* ks, int stride,
                                            const __nv_bfloat16* q, const __nv_bfloat16* k,
                                            const ChunkDesc& cd, int heads, int h) {
  for (int i = threadIdx.x; i < kTcChunk * KD / 8; i += kThreads) {
    const int r = i / (KD / 8), c = (i % (KD / 8)) * 8;
    uint4 qv = make_uint4(0, 0, 0, 0), kv = qv;
    if (r < cd.len) {
      const int64_t off = ((cd.row_start + r) * heads + h) * KD + c;
      qv = *reinterpret_cast<const uint4*>(q + off);
      kv = *reinterpret_cast<const uint4*>(k + off);
    }
    *reinterpret_cast<uint4*>(qs + r * stride + c) = qv;
    *reinterpret_cast<uint4*>(ks + r * stride + c) = kv;
  }
}

// Four consecutive gate values as floats (16-byte f32 or 8-byte bf16 loads).
__device__ __forceinline__ float4 LoadGate4(const float* g) {
  return *reinterpret_cast<const float4*>(g);
}
__device__ __forceinline__ float4 LoadGate4(const __nv_bfloat16* g) {
  const uint2 raw = *reinterpret_cast<const uint2*>(g);
  const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&raw.x);
  const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&raw.y);
  return make_float4(__low2float(lo), __high2float(lo), __low2float(hi), __high2float(hi));
}

// The chunk-local cumulative gate in log2, G[r][d] = log2(e) * sum_{i <= r} g[i][d], into
// shared memory ([64][sg] floats, sg a multiple of 4); rows past the chunk's end add zeros, so G
// stays flat there. Needs kThreads >= 2 K (two 32-row halves summed in parallel, then the
// second half gets the first half's total). Ends with a barrier.
template <int KD, int kThreads, typename GIn>
__device__ __forceinline__ void LoadChunkGateCumsum(float* G, int sg, const GIn* g,
                                                    const ChunkDesc& cd, int heads, int h) {
  static_assert(kThreads >= 2 * KD, "one thread per column and half chunk");
  const int tid = threadIdx.x;
  for (int i = tid; i < kTcChunk * KD / 4; i += kThreads) {
    const int r = i / (KD / 4), d = (i % (KD / 4)) * 4;
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < cd.len) x = LoadGate4(g + ((cd.row_start + r) * heads + h) * KD + d);
    *reinterpret_cast<float4*>(G + r * sg + d) = x;
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

}  // namespace orrery::kernels::cuda
