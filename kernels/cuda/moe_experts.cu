// The data movement around the expert products (kernels/moe.h MoeExperts, MoeExpertsGrad): the
// gather of the inputs into expert order, the weighted combine back to tokens, its backward, and
// the scatter-add of the input gradients. One warp per row (a sorted pair or a token), lanes over
// the latent width, f32 arithmetic on bf16 or f32 storage.
//
// The per-token sums (combine, scatter-add) take the token's k rows in ascending row order, which
// is ascending expert order -- the CPU model's order -- and write each output once: no atomics,
// deterministic. Each lane first sorts the k (row, weight) pairs of its token by rank (k <= 16).
// Not yet timed: correct first (the grouped GEMMs will fuse the gather and the combine).
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/moe_cuda.h"
#include "kernels/moe.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr unsigned kFull = 0xffffffffu;

// Token t's rows (rank[t, :]) and weights in ascending row order, in every lane's registers.
struct TokenRows {
  int32_t row[kMaxTopK];
  float w[kMaxTopK];
};

__device__ __forceinline__ TokenRows SortedRows(const int32_t* rank, const float* weights,
                                                int64_t t, int k, int lane) {
  const int32_t mine = lane < k ? rank[t * k + lane] : 0;
  const float wm = lane < k && weights != nullptr ? weights[t * k + lane] : 0.0f;
  int order = 0;  // the number of t's rows before mine
  for (int j = 0; j < k; ++j) order += __shfl_sync(kFull, mine, j) < mine ? 1 : 0;
  TokenRows r;
#pragma unroll
  for (int i = 0; i < kMaxTopK; ++i) {
    if (i < k) {
      const int src = __ffs(__ballot_sync(kFull, lane < k && order == i)) - 1;
      r.row[i] = __shfl_sync(kFull, mine, src);
      r.w[i] = __shfl_sync(kFull, wm, src);
    }
  }
  return r;
}

template <typename T>
__global__ void GatherKernel(const T* __restrict__ xl, const int32_t* __restrict__ perm, int64_t m,
                             int k, int64_t l, T* __restrict__ xg) {
  const int lane = threadIdx.x % 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < m;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const T* src = xl + static_cast<int64_t>(perm[r] / k) * l;
    for (int64_t i = lane; i < l; i += 32) xg[r * l + i] = src[i];
  }
}

template <typename T>
__global__ void CombineKernel(const T* __restrict__ o, const float* __restrict__ weights,
                              const int32_t* __restrict__ rank, int64_t n, int k, int64_t l,
                              T* __restrict__ y) {
  const int lane = threadIdx.x % 32;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; t < n;
       t += static_cast<int64_t>(gridDim.x) * kWarps) {
    const TokenRows r = SortedRows(rank, weights, t, k, lane);
    for (int64_t i = lane; i < l; i += 32) {
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < kMaxTopK; ++j) {
        if (j < k) acc += r.w[j] * ToF(o[static_cast<int64_t>(r.row[j]) * l + i]);
      }
      y[t * l + i] = FromF<T>(acc);
    }
  }
}

template <typename T, typename G>
__global__ void CombineGradKernel(const G* __restrict__ dy, const T* __restrict__ o,
                                  const float* __restrict__ weights,
                                  const int32_t* __restrict__ perm, int64_t m, int k, int64_t l,
                                  T* __restrict__ doe, float* __restrict__ dweights) {
  const int lane = threadIdx.x % 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < m;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int32_t p = perm[r];
    const G* g = dy + static_cast<int64_t>(p / k) * l;
    const float w = weights[p];
    float dot = 0.0f;
    for (int64_t i = lane; i < l; i += 32) {
      const float gi = ToF(g[i]);
      doe[r * l + i] = FromF<T>(w * gi);
      dot += gi * ToF(o[r * l + i]);
    }
    dot = WarpSum(dot);
    if (lane == 0) dweights[p] = dot;
  }
}

__global__ void ScatterAddKernel(const float* __restrict__ dxg, const int32_t* __restrict__ rank,
                                 int64_t n, int k, int64_t l, float* __restrict__ dxl) {
  const int lane = threadIdx.x % 32;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; t < n;
       t += static_cast<int64_t>(gridDim.x) * kWarps) {
    const TokenRows r = SortedRows(rank, nullptr, t, k, lane);
    for (int64_t i = lane; i < l; i += 32) {
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < kMaxTopK; ++j) {
        if (j < k) acc += dxg[static_cast<int64_t>(r.row[j]) * l + i];
      }
      dxl[t * l + i] += acc;
    }
  }
}

template <typename T>
const T* In(const Tensor& t) {
  return static_cast<const T*>(t.raw_data());
}
template <typename T>
T* Out(Tensor* t) {
  return static_cast<T*>(t->raw_data());
}

template <typename T>
Status Gather(const Tensor& xl, const Tensor& perm, int64_t k, Tensor* xg, cudaStream_t s) {
  const int64_t m = perm.numel();
  GatherKernel<T><<<GridFor(m, kWarps), kThreads, 0, s>>>(
      In<T>(xl), perm.data<int32_t>(), m, static_cast<int>(k), xl.dim(1), Out<T>(xg));
  return LastLaunchStatus("GatherKernel");
}

template <typename T>
Status Combine(const Tensor& o, const Tensor& weights, const Tensor& rank, Tensor* y,
               cudaStream_t s) {
  const int64_t n = rank.dim(0);
  CombineKernel<T><<<GridFor(n, kWarps), kThreads, 0, s>>>(
      In<T>(o), weights.data<float>(), rank.data<int32_t>(), n, static_cast<int>(rank.dim(1)),
      o.dim(1), Out<T>(y));
  return LastLaunchStatus("CombineKernel");
}

template <typename T, typename G>
Status CombineGrad(const Tensor& dy, const Tensor& o, const Tensor& weights, const Tensor& perm,
                   int64_t k, Tensor* doe, Tensor* dweights, cudaStream_t s) {
  const int64_t m = perm.numel();
  CombineGradKernel<T, G><<<GridFor(m, kWarps), kThreads, 0, s>>>(
      In<G>(dy), In<T>(o), weights.data<float>(), perm.data<int32_t>(), m, static_cast<int>(k),
      o.dim(1), Out<T>(doe), dweights->data<float>());
  return LastLaunchStatus("CombineGradKernel");
}

}  // namespace

Status MoeGatherCuda(const Tensor& xl, const Tensor& perm, int64_t top_k, Tensor* xg) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(xl.device().index));
  return xl.dtype() == DType::kBF16 ? Gather<__nv_bfloat16>(xl, perm, top_k, xg, ctx->stream())
                                    : Gather<float>(xl, perm, top_k, xg, ctx->stream());
}

Status MoeCombineCuda(const Tensor& o, const Tensor& weights, const Tensor& rank, Tensor* y) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(o.device().index));
  return o.dtype() == DType::kBF16 ? Combine<__nv_bfloat16>(o, weights, rank, y, ctx->stream())
                                   : Combine<float>(o, weights, rank, y, ctx->stream());
}

Status MoeCombineGradCuda(const Tensor& dy, const Tensor& o, const Tensor& weights,
                          const Tensor& perm, int64_t top_k, Tensor* doe, Tensor* dweights) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(o.device().index));
  const cudaStream_t s = ctx->stream();
  const bool t_bf16 = o.dtype() == DType::kBF16, g_bf16 = dy.dtype() == DType::kBF16;
  if (t_bf16) {
    return g_bf16
               ? CombineGrad<__nv_bfloat16, __nv_bfloat16>(dy, o, weights, perm, top_k, doe,
                                                           dweights, s)
               : CombineGrad<__nv_bfloat16, float>(dy, o, weights, perm, top_k, doe, dweights, s);
  }
  return CombineGrad<float, float>(dy, o, weights, perm, top_k, doe, dweights, s);
}

Status MoeScatterAddCuda(const Tensor& dxg, const Tensor& rank, Tensor* dxl) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(dxg.device().index));
  const int64_t n = rank.dim(0);
  ScatterAddKernel<<<GridFor(n, kWarps), kThreads, 0, ctx->stream()>>>(
      dxg.data<float>(), rank.data<int32_t>(), n, static_cast<int>(rank.dim(1)), dxg.dim(1),
      dxl->data<float>());
  return LastLaunchStatus("ScatterAddKernel");
}

}  // namespace orrery::kernels::cuda
