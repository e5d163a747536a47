// Block AttnRes mixing forward and backward (kernels/attn_res.h): one warp per token row,
// grid-stride over rows, every sum, the scores and the softmax in f32 (spec §6.4), precise expf.
// The source (and source-gradient) pointers travel by value as one __grid_constant__ argument of
// kAttnResMaxSourcesCuda entries (1 KB each, within the 4 KB of kernel parameters).
//
// Forward, per row: pass 1 reads each source's d elements once for its mean square and its dot
// with u = gamma w (the score), the warp's n scores go to shared memory, the softmax is taken
// there; pass 2 reads the sources again for h = sum_i p_i v_i.
// Backward, per row: pass 1 reads each source once with dh for dp_i = <dh, v_i>, r_i and
// <k_i, u>; the per-source coefficients follow in shared memory; pass 2 reads the sources again
// and adds into each d_source (its own lane does every (row, element) read-modify-write, so no
// atomics, and entries that alias one buffer are still summed correctly). du = sum ds_i r_i v_i is
// summed per block in shared memory when d fits beside the coefficients in the default 48 KB,
// else straight into the global dw / dgamma; then dw += du gamma, dgamma += du w once per block
// (float atomics: the last bits depend on the order of blocks).
// Not yet timed: correct first; fusing with the next RMSNorm (spec §6.4) comes with the profile.
#include <cmath>

#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kMaxSources = kAttnResMaxSourcesCuda;
constexpr size_t kSharedBytes = 48 * 1024;  // the default limit of a block's shared memory

struct SourcePtrs {
  const void* v[kMaxSources];
};
struct GradPtrs {
  float* v[kMaxSources];
};

template <typename T>
__device__ __forceinline__ const T* Row(const SourcePtrs& s, int i, int64_t r, int64_t d) {
  return static_cast<const T*>(s.v[i]) + r * d;
}

// Shared memory: the warps' probabilities, [kWarps][n].
template <typename T>
__global__ void AttnResMixKernel(const __grid_constant__ SourcePtrs src, int n, int64_t rows,
                                 int64_t d, const T* __restrict__ w, const T* __restrict__ gamma,
                                 float eps, T* __restrict__ h, float* __restrict__ p) {
  extern __shared__ float smem[];
  const int lane = threadIdx.x % 32;
  float* pr = smem + (threadIdx.x / 32) * n;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    // Every lane ends with the same warp sums (xor butterfly), so m is uniform across the warp.
    float m = -INFINITY;
    for (int i = 0; i < n; ++i) {
      const T* v = Row<T>(src, i, r, d);
      float ss = 0.0f, dot = 0.0f;
      for (int64_t c = lane; c < d; c += 32) {
        const float x = ToF(v[c]);
        ss += x * x;
        dot += x * (ToF(gamma[c]) * ToF(w[c]));
      }
      const float score = WarpSum(dot) * rsqrtf(WarpSum(ss) / static_cast<float>(d) + eps);
      if (lane == 0) pr[i] = score;
      m = fmaxf(m, score);
    }
    __syncwarp();
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) sum += expf(pr[i] - m);
    __syncwarp();
    for (int i = lane; i < n; i += 32) {
      pr[i] = expf(pr[i] - m) / sum;
      if (p != nullptr) p[r * n + i] = pr[i];
    }
    __syncwarp();
    T* hr = h + r * d;
    for (int64_t c = lane; c < d; c += 32) {
      float acc = 0.0f;
      for (int i = 0; i < n; ++i) acc += pr[i] * ToF(Row<T>(src, i, r, d)[c]);
      hr[c] = FromF<T>(acc);
    }
    __syncwarp();  // pr is rewritten for the next row
  }
}

// Shared memory: [3][kWarps][n] per-source coefficients, then du [d] when du_shared.
template <typename T>
__global__ void AttnResMixGradKernel(const __grid_constant__ SourcePtrs src,
                                     const __grid_constant__ GradPtrs dsrc, int n, int64_t rows,
                                     int64_t d, const T* __restrict__ w,
                                     const T* __restrict__ gamma, float eps,
                                     const float* __restrict__ p, const T* __restrict__ dh,
                                     float* __restrict__ dw, float* __restrict__ dgamma,
                                     bool du_shared) {
  extern __shared__ float smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // Pass 1 leaves dp_i, r_i, <k_i, u> in a, b, q; then a = coef_i = ds_i r_i,
  // b = e_i = coef_i r_i <k_i, u> / d, q = p_i, the terms of
  // dv_i = p_i dh + coef_i u - e_i v_i and du += coef_i v_i.
  float* a = smem + warp * n;
  float* b = smem + (kWarps + warp) * n;
  float* q = smem + (2 * kWarps + warp) * n;
  float* du_part = smem + 3 * kWarps * n;
  if (du_shared) {
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) du_part[c] = 0.0f;
    __syncthreads();
  }
  const float inv_d = 1.0f / static_cast<float>(d);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + warp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const T* dhr = dh + r * d;
    const float* pr = p + r * n;
    float pdp = 0.0f;  // sum_j p_j dp_j, uniform across the warp
    for (int i = 0; i < n; ++i) {
      const T* v = Row<T>(src, i, r, d);
      float dp = 0.0f, vu = 0.0f, ss = 0.0f;
      for (int64_t c = lane; c < d; c += 32) {
        const float x = ToF(v[c]);
        dp += ToF(dhr[c]) * x;
        vu += x * (ToF(gamma[c]) * ToF(w[c]));
        ss += x * x;
      }
      dp = WarpSum(dp);
      const float rs = rsqrtf(WarpSum(ss) * inv_d + eps);
      vu = WarpSum(vu);
      if (lane == 0) {
        a[i] = dp;
        b[i] = rs;
        q[i] = vu * rs;
      }
      pdp += pr[i] * dp;
    }
    __syncwarp();
    for (int i = lane; i < n; i += 32) {
      const float coef = pr[i] * (a[i] - pdp) * b[i];
      const float e = coef * b[i] * q[i] * inv_d;
      a[i] = coef;
      b[i] = e;
      q[i] = pr[i];
    }
    __syncwarp();
    for (int64_t c = lane; c < d; c += 32) {
      const float uc = ToF(gamma[c]) * ToF(w[c]), g = ToF(dhr[c]);
      float du = 0.0f;
      for (int i = 0; i < n; ++i) {
        const float x = ToF(Row<T>(src, i, r, d)[c]);
        du += a[i] * x;
        if (dsrc.v[i] != nullptr) dsrc.v[i][r * d + c] += q[i] * g + a[i] * uc - b[i] * x;
      }
      if (du_shared) {
        atomicAdd(&du_part[c], du);
      } else {
        atomicAdd(&dw[c], du * ToF(gamma[c]));
        atomicAdd(&dgamma[c], du * ToF(w[c]));
      }
    }
    __syncwarp();  // a, b, q are rewritten for the next row
  }
  if (du_shared) {
    __syncthreads();
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
      atomicAdd(&dw[c], du_part[c] * ToF(gamma[c]));
      atomicAdd(&dgamma[c], du_part[c] * ToF(w[c]));
    }
  }
}

SourcePtrs PointersOf(const std::vector<Tensor>& sources) {
  SourcePtrs s{};
  for (size_t i = 0; i < sources.size(); ++i) s.v[i] = sources[i].raw_data();
  return s;
}

template <typename T>
const T* In(const Tensor& t) {
  return static_cast<const T*>(t.raw_data());
}

template <typename T>
Status Mix(const std::vector<Tensor>& sources, const Tensor& w, const Tensor& gamma, double eps,
           Tensor* h, Tensor* p, cudaStream_t s) {
  const int n = static_cast<int>(sources.size());
  const int64_t rows = sources[0].dim(0), d = sources[0].dim(1);
  const size_t smem = sizeof(float) * kWarps * n;
  AttnResMixKernel<T><<<GridFor(rows, kWarps), kThreads, smem, s>>>(
      PointersOf(sources), n, rows, d, In<T>(w), In<T>(gamma), static_cast<float>(eps),
      static_cast<T*>(h->raw_data()), p != nullptr ? p->data<float>() : nullptr);
  return LastLaunchStatus("AttnResMixKernel");
}

template <typename T>
Status MixGrad(const std::vector<Tensor>& sources, const Tensor& w, const Tensor& gamma, double eps,
               const Tensor& p, const Tensor& dh, const std::vector<Tensor>& d_sources, Tensor* dw,
               Tensor* dgamma, cudaStream_t s) {
  const int n = static_cast<int>(sources.size());
  const int64_t rows = sources[0].dim(0), d = sources[0].dim(1);
  GradPtrs g{};
  for (int i = 0; i < n; ++i)
    g.v[i] = d_sources[i].defined() ? d_sources[i].data<float>() : nullptr;
  const size_t coef_bytes = sizeof(float) * 3 * kWarps * n;
  const size_t du_bytes = sizeof(float) * static_cast<size_t>(d);
  const bool du_shared = coef_bytes + du_bytes <= kSharedBytes;
  AttnResMixGradKernel<T>
      <<<GridFor(rows, kWarps), kThreads, coef_bytes + (du_shared ? du_bytes : 0), s>>>(
          PointersOf(sources), g, n, rows, d, In<T>(w), In<T>(gamma), static_cast<float>(eps),
          p.data<float>(), In<T>(dh), dw->data<float>(), dgamma->data<float>(), du_shared);
  return LastLaunchStatus("AttnResMixGradKernel");
}

}  // namespace

Status AttnResMixCuda(const std::vector<Tensor>& sources, const Tensor& w, const Tensor& gamma,
                      double eps, Tensor* h, Tensor* p) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(w.device().index));
  if (w.dtype() == DType::kBF16) {
    return Mix<__nv_bfloat16>(sources, w, gamma, eps, h, p, ctx->stream());
  }
  return Mix<float>(sources, w, gamma, eps, h, p, ctx->stream());
}

Status AttnResMixGradCuda(const std::vector<Tensor>& sources, const Tensor& w, const Tensor& gamma,
                          double eps, const Tensor& p, const Tensor& dh,
                          const std::vector<Tensor>& d_sources, Tensor* dw, Tensor* dgamma) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(w.device().index));
  if (w.dtype() == DType::kBF16) {
    return MixGrad<__nv_bfloat16>(sources, w, gamma, eps, p, dh, d_sources, dw, dgamma,
                                  ctx->stream());
  }
  return MixGrad<float>(sources, w, gamma, eps, p, dh, d_sources, dw, dgamma, ctx->stream());
}

}  // namespace orrery::kernels::cuda
