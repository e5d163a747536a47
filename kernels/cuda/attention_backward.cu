// Causal attention backward per document (kernels/attention.h), FlashAttention-2 style on SIMT
// cores, in three deterministic passes (no atomics, no f32 scratch for dq):
//   1. AttentionRowDotKernel: D = rowsum(dO * O) per (token, head), f32 [N, H].
//   2. AttentionDkDvKernel: one block per (32-key tile, head) streams the 32-query tiles that may
//      see its keys (from its first key to the end of its last key's document), recomputes
//      P = exp(scale q k^T - lse) and dS = P (dO v^T - D), and sums dV = P^T dO and
//      dK = scale dS^T Q in registers.
//   3. AttentionDqKernel: one block per (32-query tile, head) streams its visible key tiles as the
//      forward does and sums dQ = scale dS K.
// The separate dq pass recomputes P and dS (7 tile products per score instead of 5) in exchange
// for writing dq once, in its own dtype, with the same bits on every run.
//
// Plain f32 FMAs (bf16 inputs widened on load), no tensor cores: the reference fallback. bf16
// inputs with the model's head dims run the preprocess here and then the tensor-core kernels
// (attention_backward_tc.cu, on Hopper attention_backward_dq_wgmma.cu and
// attention_backward_dkdv_wgmma.cu) instead, unless the caller asks for AttentionKernels::kSimt;
// f32 inputs and other head dims always run these passes.
// Measured time (tests/gpu/attention_gpu_bench.cc, H200, bf16, (B, T, H) = (4, 8192, 16), qk 192 /
// v 128): 5.5 causal TFLOP/s.
#include <cmath>

#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/attention_tiles.cuh"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace attention {
namespace {

// D[row] = sum_c dO[row][c] O[row][c] over rows = N * H: one warp per row, grid-stride.
template <typename T>
__global__ void AttentionRowDotKernel(const T* __restrict__ o, const T* __restrict__ d_o,
                                      int64_t rows, int dv, float* __restrict__ dsum) {
  const int lane = threadIdx.x % 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const T* orow = o + r * dv;
    const T* grow = d_o + r * dv;
    float acc = 0.0f;
    for (int c = lane; c < dv; c += 32) acc += ToF(orow[c]) * ToF(grow[c]);
    acc = WarpSum(acc);
    if (lane == 0) dsum[r] = acc;
  }
}

// Shared memory of the dk/dv pass: the block's keys [kTile][dqk] and values [kTile][dv] (read by
// broadcast), the streamed queries [kTile][Padded(dqk)] and output gradients [kTile][Padded(dv)]
// (read one row per lane, then one column per lane). The dq pass holds the same four tiles with
// the roles of (q, dO) and (k, v) swapped.
size_t BackwardSharedBytes(int dqk, int dv) {
  return sizeof(float) * kTile * (dqk + dv + Padded(dqk) + Padded(dv));
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    AttentionDkDvKernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                        const float* __restrict__ lse, const float* __restrict__ dsum,
                        const T* __restrict__ d_o, const int64_t* __restrict__ cu, int64_t entries,
                        int64_t n, int heads, int dqk, int dv, float scale, T* __restrict__ dk,
                        T* __restrict__ dv_out) {
  extern __shared__ float smem[];
  __shared__ int64_t q_start[kTile];  // the first token of each streamed query's document
  __shared__ float q_lse[kTile], q_dsum[kTile];
  __shared__ int64_t q_stop;  // the end of the block's last key's document
  const int ldq = Padded(dqk), ldo = Padded(dv);
  float* kk = smem;
  float* vv = kk + kTile * dqk;
  float* qs = vv + kTile * dv;
  float* dos = qs + kTile * ldq;
  const int h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t k_last = (k0 + kTile < n ? k0 + kTile : n) - 1;

  LoadTile(k, k0, n, heads, h, dqk, kk, dqk);
  LoadTile(v, k0, n, heads, h, dv, vv, dv);
  if (threadIdx.x == 0) {
    const int64_t stop = cu[DocOf(cu, entries, k_last) + 1];
    q_stop = stop < n ? stop : n;
  }

  float adk[kRowsPerWarp][kMaxPerLane] = {}, adv[kRowsPerWarp][kMaxPerLane] = {};
  const float* kw = kk + warp * kRowsPerWarp * dqk;
  const float* vw = vv + warp * kRowsPerWarp * dv;
  __syncthreads();

  for (int64_t qb = k0; qb < q_stop; qb += kTile) {
    __syncthreads();  // the previous query tiles are consumed
    LoadTile(q, qb, n, heads, h, dqk, qs, ldq);
    LoadTile(d_o, qb, n, heads, h, dv, dos, ldo);
    if (threadIdx.x < kTile) {
      const int64_t i = qb + threadIdx.x;
      const bool in = i < n;
      q_start[threadIdx.x] = in ? cu[DocOf(cu, entries, i)] : n;
      q_lse[threadIdx.x] = in ? lse[i * heads + h] : 0.0f;
      q_dsum[threadIdx.x] = in ? dsum[i * heads + h] : 0.0f;
    }
    __syncthreads();

    float s[kRowsPerWarp] = {}, dp[kRowsPerWarp] = {};
    const float* qr = qs + lane * ldq;
    for (int d = 0; d < dqk; ++d) {
      const float qd = qr[d];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) s[r] += kw[r * dqk + d] * qd;
    }
    const float* gr = dos + lane * ldo;
    for (int c = 0; c < dv; ++c) {
      const float gc = gr[c];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) dp[r] += vw[r * dv + c] * gc;
    }
    const int64_t i = qb + lane;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t j = k0 + warp * kRowsPerWarp + r;
      // Query i sees key j when both lie in one document and j <= i.
      const bool valid = j <= k_last && i < n && j <= i && q_start[lane] <= j;
      if (!__any_sync(0xffffffffu, valid)) continue;
      const float p = valid ? expf(s[r] * scale - q_lse[lane]) : 0.0f;
      const float ds = p * (dp[r] - q_dsum[lane]);
      for (int ii = 0; ii < kTile; ++ii) {
        const float pi = __shfl_sync(0xffffffffu, p, ii);
        const float dsi = __shfl_sync(0xffffffffu, ds, ii);
        const float* qrow = qs + ii * ldq;
        const float* grow = dos + ii * ldo;
#pragma unroll
        for (int e = 0; e < kMaxPerLane; ++e) {
          const int c = lane + 32 * e;
          if (c < dv) adv[r][e] += pi * grow[c];
          if (c < dqk) adk[r][e] += dsi * qrow[c];
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t j = k0 + warp * kRowsPerWarp + r;
    if (j > k_last) continue;
    T* dkrow = dk + (j * heads + h) * static_cast<int64_t>(dqk);
    T* dvrow = dv_out + (j * heads + h) * static_cast<int64_t>(dv);
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int c = lane + 32 * e;
      if (c < dqk) dkrow[c] = FromF<T>(adk[r][e] * scale);
      if (c < dv) dvrow[c] = FromF<T>(adv[r][e]);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    AttentionDqKernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                      const float* __restrict__ lse, const float* __restrict__ dsum,
                      const T* __restrict__ d_o, const int64_t* __restrict__ cu, int64_t entries,
                      int64_t n, int heads, int dqk, int dv, float scale, T* __restrict__ dq) {
  extern __shared__ float smem[];
  __shared__ int64_t row_start[kTile];  // the first token of each query row's document
  const int ldk = Padded(dqk), ldv = Padded(dv);
  float* qs = smem;
  float* dos = qs + kTile * dqk;
  float* ks = dos + kTile * dv;
  float* vs = ks + kTile * ldk;
  const int h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t q_last = (q0 + kTile < n ? q0 + kTile : n) - 1;

  LoadTile(q, q0, n, heads, h, dqk, qs, dqk);
  LoadTile(d_o, q0, n, heads, h, dv, dos, dv);
  if (threadIdx.x < kTile) {
    const int64_t i = q0 + threadIdx.x < q_last ? q0 + threadIdx.x : q_last;
    row_start[threadIdx.x] = cu[DocOf(cu, entries, i)];
  }
  float row_lse[kRowsPerWarp], row_dsum[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t i = q0 + warp * kRowsPerWarp + r;
    row_lse[r] = i <= q_last ? lse[i * heads + h] : 0.0f;
    row_dsum[r] = i <= q_last ? dsum[i * heads + h] : 0.0f;
  }
  __syncthreads();

  float acc[kRowsPerWarp][kMaxPerLane] = {};
  const float* qw = qs + warp * kRowsPerWarp * dqk;
  const float* gw = dos + warp * kRowsPerWarp * dv;

  for (int64_t kb = row_start[0] > 0 ? row_start[0] : 0; kb <= q_last; kb += kTile) {
    __syncthreads();  // the previous key and value tiles are consumed
    LoadTile(k, kb, n, heads, h, dqk, ks, ldk);
    LoadTile(v, kb, n, heads, h, dv, vs, ldv);
    __syncthreads();

    float s[kRowsPerWarp] = {}, dp[kRowsPerWarp] = {};
    const float* kr = ks + lane * ldk;
    for (int d = 0; d < dqk; ++d) {
      const float kd = kr[d];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) s[r] += qw[r * dqk + d] * kd;
    }
    const float* vr = vs + lane * ldv;
    for (int c = 0; c < dv; ++c) {
      const float vc = vr[c];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) dp[r] += gw[r * dv + c] * vc;
    }
    const int64_t j = kb + lane;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r;
      const int64_t i = q0 + row;
      const bool valid = i <= q_last && j >= row_start[row] && j <= i;
      if (!__any_sync(0xffffffffu, valid)) continue;
      const float p = valid ? expf(s[r] * scale - row_lse[r]) : 0.0f;
      const float ds = p * (dp[r] - row_dsum[r]);
      for (int jj = 0; jj < kTile; ++jj) {
        const float dsj = __shfl_sync(0xffffffffu, ds, jj);
        const float* krow = ks + jj * ldk;
#pragma unroll
        for (int e = 0; e < kMaxPerLane; ++e) {
          const int c = lane + 32 * e;
          if (c < dqk) acc[r][e] += dsj * krow[c];
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t i = q0 + warp * kRowsPerWarp + r;
    if (i > q_last) continue;
    T* dqrow = dq + (i * heads + h) * static_cast<int64_t>(dqk);
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int c = lane + 32 * e;
      if (c < dqk) dqrow[c] = FromF<T>(acc[r][e] * scale);
    }
  }
}

// With `tensor_cores` (AttentionTcSupported inputs), the preprocess here and then the
// tensor-core kernels (attention_backward_tc.cu, or with `wgmma` attention_backward_dq_wgmma.cu and
// attention_backward_dkdv_wgmma.cu); else the SIMT passes.
template <typename T>
Status Backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                const Tensor& lse, const Tensor& d_o, const Tensor& cu, double scale, Tensor* dq,
                Tensor* dk, Tensor* dv, bool tensor_cores, bool wgmma, cudaStream_t stream) {
  const int64_t n = q.dim(0);
  const int heads = static_cast<int>(q.dim(1)), dqk = static_cast<int>(q.dim(2)),
            dvd = static_cast<int>(v.dim(2));
  const auto* qp = static_cast<const T*>(q.raw_data());
  const auto* kp = static_cast<const T*>(k.raw_data());
  const auto* vp = static_cast<const T*>(v.raw_data());
  const auto* gp = static_cast<const T*>(d_o.raw_data());
  const float sc = static_cast<float>(scale);
  ORRERY_ASSIGN_OR_RETURN(Tensor dsum, Tensor::Allocate({n, q.dim(1)}, DType::kF32, q.device()));

  AttentionRowDotKernel<T><<<GridFor(n * heads, kWarps), kThreads, 0, stream>>>(
      static_cast<const T*>(o.raw_data()), gp, n * heads, dvd, dsum.data<float>());
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("AttentionRowDotKernel"));
  if (tensor_cores && wgmma) {
    ORRERY_RETURN_IF_ERROR(AttentionDkDvWgmma(q, k, v, lse, dsum, d_o, cu, scale, dk, dv, stream));
    return AttentionDqWgmma(q, k, v, lse, dsum, d_o, cu, scale, dq, stream);
  }
  if (tensor_cores) {
    return AttentionBackwardTc(q, k, v, lse, dsum, d_o, cu, scale, dq, dk, dv, stream);
  }

  const size_t smem = BackwardSharedBytes(dqk, dvd);
  const dim3 grid(static_cast<unsigned>((n + kTile - 1) / kTile), static_cast<unsigned>(heads));
  ORRERY_RETURN_IF_ERROR(
      AllowSharedBytes(AttentionDkDvKernel<T>, smem, "AttentionDkDvKernel shared memory"));
  AttentionDkDvKernel<T><<<grid, kThreads, smem, stream>>>(
      qp, kp, vp, lse.data<float>(), dsum.data<float>(), gp, cu.data<int64_t>(), cu.numel(), n,
      heads, dqk, dvd, sc, static_cast<T*>(dk->raw_data()), static_cast<T*>(dv->raw_data()));
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("AttentionDkDvKernel"));

  ORRERY_RETURN_IF_ERROR(
      AllowSharedBytes(AttentionDqKernel<T>, smem, "AttentionDqKernel shared memory"));
  AttentionDqKernel<T><<<grid, kThreads, smem, stream>>>(
      qp, kp, vp, lse.data<float>(), dsum.data<float>(), gp, cu.data<int64_t>(), cu.numel(), n,
      heads, dqk, dvd, sc, static_cast<T*>(dq->raw_data()));
  return LastLaunchStatus("AttentionDqKernel");
}

}  // namespace
}  // namespace attention

Status CausalAttentionBackwardCuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& o, const Tensor& lse, const Tensor& d_o,
                                   const Tensor& cu_seqlens, double scale, Tensor* dq, Tensor* dk,
                                   Tensor* dv, AttentionKernels kernels) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(q.device().index));
  if (q.dtype() == DType::kBF16) {
    const bool tc = kernels != AttentionKernels::kSimt && AttentionTcSupported(q, v);
    const bool wgmma =
        tc && (kernels == AttentionKernels::kFastest || kernels == AttentionKernels::kWgmma) &&
        AttentionWgmmaSupported(q, k, v, scale) &&
        reinterpret_cast<uintptr_t>(d_o.raw_data()) % 16 == 0;
    return attention::Backward<__nv_bfloat16>(q, k, v, o, lse, d_o, cu_seqlens, scale, dq, dk, dv,
                                              tc, wgmma, ctx->stream());
  }
  return attention::Backward<float>(q, k, v, o, lse, d_o, cu_seqlens, scale, dq, dk, dv, false,
                                    false, ctx->stream());
}

}  // namespace orrery::kernels::cuda
