// Causal attention forward per document (kernels/attention.h), flash-attention style on SIMT
// cores: one block per (32-query tile, head) streams the 32-key tiles of the keys its queries may
// see (from the document start of its first query up to its last query) through shared memory,
// keeps each row's running max, sum and output in f32 registers (online softmax), and writes o and
// the natural log-sum-exp. No [N, N] scores in global memory.
//
// Plain f32 FMAs (bf16 inputs widened on load), no tensor cores; a tile that straddles documents
// scans the earlier document's keys masked. The reference fallback: bf16 inputs with the model's
// head dims run a tensor-core kernel instead (attention_forward_wgmma.cu on Hopper, else
// attention_forward_tc.cu; AttentionKernels in ops_cuda.h), unless the caller asks for
// AttentionKernels::kSimt; f32 inputs and other head dims always run here.
// Measured time (tests/gpu/attention_gpu_bench.cc, H200, bf16, (B, T, H) = (4, 8192, 16), qk 192 /
// v 128): 6.6 causal TFLOP/s.
// The row map (attention_tc_layout.h) makes the same kernel PrefixCausalAttention's: per query row
// the first and last key it sees.
#include <cmath>

#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/attention_tc_layout.h"
#include "kernels/cuda/attention_tiles.cuh"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace attention {
namespace {

// Shared memory: the query tile [kTile][dqk] (read by broadcast), the key tile
// [kTile][Padded(dqk)] (one row per lane), the value tile [kTile][dv] (one column per lane).
size_t ForwardSharedBytes(int dqk, int dv) {
  return sizeof(float) * kTile * (dqk + Padded(dqk) + dv);
}

// Rows: the keys each query row sees (attention_tc_layout.h: CausalRows, PrefixRows); n query
// rows, nk key rows.
template <typename T, class Rows>
__global__ void __launch_bounds__(kThreads)
    AttentionForwardKernel(const T* __restrict__ q, const T* __restrict__ k,
                           const T* __restrict__ v, const Rows rows, int64_t n, int64_t nk,
                           int heads, int dqk, int dv, float scale, T* __restrict__ o,
                           float* __restrict__ lse) {
  extern __shared__ float smem[];
  // The first and last key each query row sees (causal: its document's first token and itself).
  __shared__ int64_t row_start[kTile], row_end[kTile];
  const int ldk = Padded(dqk);
  float* qs = smem;
  float* ks = qs + kTile * dqk;
  float* vs = ks + kTile * ldk;
  const int h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t q_last = (q0 + kTile < n ? q0 + kTile : n) - 1;

  LoadTile(q, q0, n, heads, h, dqk, qs, dqk);
  if (threadIdx.x < kTile) {
    const int64_t i = q0 + threadIdx.x < q_last ? q0 + threadIdx.x : q_last;
    row_start[threadIdx.x] = rows.First(i);
    row_end[threadIdx.x] = rows.Last(i);
  }
  __syncthreads();

  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kMaxPerLane];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) acc[r][e] = 0.0f;
  }
  const float* qw = qs + warp * kRowsPerWarp * dqk;

  const int64_t kv_end = row_end[q_last - q0];
  for (int64_t kb = row_start[0] > 0 ? row_start[0] : 0; kb <= kv_end; kb += kTile) {
    __syncthreads();  // the previous key and value tiles are consumed
    LoadTile(k, kb, nk, heads, h, dqk, ks, ldk);
    LoadTile(v, kb, nk, heads, h, dv, vs, dv);
    __syncthreads();

    float s[kRowsPerWarp] = {};
    const float* kr = ks + lane * ldk;
    for (int d = 0; d < dqk; ++d) {
      const float kd = kr[d];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) s[r] += qw[r * dqk + d] * kd;
    }
    const int64_t j = kb + lane;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r;
      const int64_t i = q0 + row;
      const bool valid = i <= q_last && j >= row_start[row] && j <= row_end[row];
      const float sr = valid ? s[r] * scale : -INFINITY;
      const float m_new = fmaxf(m[r], WarpMax(sr));
      if (m_new == -INFINITY) continue;  // warp-uniform: no visible key for this row yet
      const float p = valid ? expf(sr - m_new) : 0.0f;
      const float alpha = expf(m[r] - m_new);  // 0 for the first visible keys (m = -inf)
      l[r] = l[r] * alpha + WarpSum(p);
      m[r] = m_new;
#pragma unroll
      for (int e = 0; e < kMaxPerLane; ++e) acc[r][e] *= alpha;
      for (int jj = 0; jj < kTile; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, p, jj);
        const float* vr = vs + jj * dv;
#pragma unroll
        for (int e = 0; e < kMaxPerLane; ++e) {
          const int c = lane + 32 * e;
          if (c < dv) acc[r][e] += pj * vr[c];
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t i = q0 + warp * kRowsPerWarp + r;
    if (i > q_last) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;  // 0: no visible key (o = 0)
    T* orow = o + (i * heads + h) * static_cast<int64_t>(dv);
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int c = lane + 32 * e;
      if (c < dv) orow[c] = FromF<T>(acc[r][e] * inv);
    }
    if (lane == 0) lse[i * heads + h] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
  }
}

template <typename T, class Rows>
Status Forward(const Tensor& q, const Tensor& k, const Tensor& v, const Rows& rows, double scale,
               Tensor* o, Tensor* lse, cudaStream_t stream) {
  const int64_t n = q.dim(0);
  const int heads = static_cast<int>(q.dim(1)), dqk = static_cast<int>(q.dim(2)),
            dv = static_cast<int>(v.dim(2));
  const size_t smem = ForwardSharedBytes(dqk, dv);
  ORRERY_RETURN_IF_ERROR(AllowSharedBytes(AttentionForwardKernel<T, Rows>, smem,
                                          "AttentionForwardKernel shared memory"));
  const dim3 grid(static_cast<unsigned>((n + kTile - 1) / kTile), static_cast<unsigned>(heads));
  AttentionForwardKernel<T, Rows><<<grid, kThreads, smem, stream>>>(
      static_cast<const T*>(q.raw_data()), static_cast<const T*>(k.raw_data()),
      static_cast<const T*>(v.raw_data()), rows, n, k.dim(0), heads, dqk, dv,
      static_cast<float>(scale), static_cast<T*>(o->raw_data()), lse->data<float>());
  return LastLaunchStatus("AttentionForwardKernel");
}

// CausalAttention's: the row map of cu_seqlens.
template <typename T>
Status Forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu, double scale,
               Tensor* o, Tensor* lse, cudaStream_t stream) {
  const attention_tc::CausalRows rows{cu.data<int64_t>(), cu.numel(), q.dim(0)};
  return Forward<T>(q, k, v, rows, scale, o, lse, stream);
}

}  // namespace
}  // namespace attention

Status CausalAttentionForwardCuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& cu_seqlens, double scale, Tensor* o, Tensor* lse,
                                  AttentionKernels kernels) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(q.device().index));
  const bool wgmma = kernels == AttentionKernels::kFastest || kernels == AttentionKernels::kWgmma;
  if (wgmma && AttentionWgmmaSupported(q, k, v, scale)) {
    return AttentionForwardWgmma(q, k, v, cu_seqlens, scale, o, lse, ctx->stream());
  }
  if (kernels != AttentionKernels::kSimt && AttentionTcSupported(q, v)) {
    return AttentionForwardTc(q, k, v, cu_seqlens, scale, o, lse, ctx->stream());
  }
  if (q.dtype() == DType::kBF16) {
    return attention::Forward<__nv_bfloat16>(q, k, v, cu_seqlens, scale, o, lse, ctx->stream());
  }
  return attention::Forward<float>(q, k, v, cu_seqlens, scale, o, lse, ctx->stream());
}

Status PrefixCausalAttentionForwardCuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& cu_q, const Tensor& cu_k, double scale,
                                        Tensor* o, Tensor* lse, AttentionKernels kernels) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(q.device().index));
  const bool wgmma = kernels == AttentionKernels::kFastest || kernels == AttentionKernels::kWgmma;
  if (wgmma && AttentionWgmmaSupported(q, k, v, scale)) {
    return PrefixAttentionForwardWgmma(q, k, v, cu_q, cu_k, scale, o, lse, ctx->stream());
  }
  if (kernels != AttentionKernels::kSimt && AttentionTcSupported(q, v)) {
    return PrefixAttentionForwardTc(q, k, v, cu_q, cu_k, scale, o, lse, ctx->stream());
  }
  const attention_tc::PrefixRows rows{cu_q.data<int64_t>(), cu_k.data<int64_t>(), cu_q.numel(),
                                      q.dim(0)};
  if (q.dtype() == DType::kBF16) {
    return attention::Forward<__nv_bfloat16>(q, k, v, rows, scale, o, lse, ctx->stream());
  }
  return attention::Forward<float>(q, k, v, rows, scale, o, lse, ctx->stream());
}

}  // namespace orrery::kernels::cuda
