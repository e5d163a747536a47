// Top-k routing and its backward (kernels/moe.h RouteTopK, RouteTopKGrad): one warp per token,
// grid-stride over tokens.
//
// Selection: the warp stages the row's s + b in shared memory as f64 (the CPU twin compares
// double(s) + float(b), so the selection, ties included, is exactly model::SelectTopK's), then k
// rounds of a warp arg-max under the total order (value descending, id ascending); lane c of the
// warp owns the elements lane + 32 c and marks the chosen in a 32-bit mask (E <= 1024).
// Weights and the backward use the CPU twin's f32 operations in its order (the sums go through
// shuffles lane by lane; products that the twin rounds before an add are written __fmul_rn so
// that no fused multiply-add changes them), so the routing weights match the twin bit for bit.
// Not yet timed: correct first.
#include <climits>
#include <cmath>

#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/moe_cuda.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr unsigned kFull = 0xffffffffu;

// (vb, ib) before (va, ia) in the selection order; ib == INT_MAX is "no candidate".
__device__ __forceinline__ bool Before(double vb, int ib, double va, int ia) {
  return ib != INT_MAX && (ia == INT_MAX || vb > va || (vb == va && ib < ia));
}

__global__ void RouteTopKKernel(const float* __restrict__ scores, const float* __restrict__ bias,
                                const int32_t* __restrict__ forced, int64_t n, int e, int k,
                                float rho, int32_t* __restrict__ ids, float* __restrict__ weights,
                                int* bad) {
  extern __shared__ double staged[];  // [kWarps, e]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  double* v = staged + warp * e;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp; t < n;
       t += static_cast<int64_t>(gridDim.x) * kWarps) {
    const float* s = scores + t * e;
    int my_id = 0;  // lane j < k holds the id of slot j
    if (forced != nullptr) {
      if (lane < k) my_id = forced[t * k + lane];
      bool ok = lane >= k || (my_id >= 0 && my_id < e);
      for (int j = 0; j < k; ++j) {
        const int other = __shfl_sync(kFull, my_id, j);
        if (lane < k && j < lane && other == my_id) ok = false;
      }
      if (!__all_sync(kFull, ok)) {
        if (lane == 0) atomicMin(bad, static_cast<int>(t));  // an exact minimum: order-free
        continue;
      }
    } else {
      for (int i = lane; i < e; i += 32) {
        v[i] = static_cast<double>(s[i]) + (bias != nullptr ? bias[i] : 0.0f);
      }
      __syncwarp();
      unsigned taken = 0;
      for (int j = 0; j < k; ++j) {
        double best = 0;
        int bi = INT_MAX;
        for (int c = 0, i = lane; i < e; ++c, i += 32) {
          if (!((taken >> c) & 1u) && Before(v[i], i, best, bi)) {
            best = v[i];
            bi = i;
          }
        }
        for (int off = 16; off > 0; off >>= 1) {
          const double ob = __shfl_xor_sync(kFull, best, off);
          const int oi = __shfl_xor_sync(kFull, bi, off);
          if (Before(ob, oi, best, bi)) {
            best = ob;
            bi = oi;
          }
        }
        if (lane == bi % 32) taken |= 1u << (bi / 32);
        if (lane == j) my_id = bi;
      }
      __syncwarp();  // every lane is done with v before the next token overwrites it
    }
    const float sv = lane < k ? s[my_id] : 0.0f;
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += __shfl_sync(kFull, sv, j);
    if (lane < k) {
      ids[t * k + lane] = my_id;
      weights[t * k + lane] = __fmul_rn(rho, sv) / (sum + 1e-20f);
    }
  }
}

__global__ void RouteTopKGradKernel(const float* __restrict__ scores,
                                    const int32_t* __restrict__ ids,
                                    const float* __restrict__ dweights, int64_t n, int e, int k,
                                    float rho, float* __restrict__ dlogits) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp; t < n;
       t += static_cast<int64_t>(gridDim.x) * kWarps) {
    const float* s = scores + t * e;
    float* dl = dlogits + t * e;
    for (int i = lane; i < e; i += 32) dl[i] = 0.0f;
    const int id = lane < k ? ids[t * k + lane] : 0;
    const float sv = lane < k ? s[id] : 0.0f;
    const float dw = lane < k ? dweights[t * k + lane] : 0.0f;
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += __shfl_sync(kFull, sv, j);
    sum += 1e-20f;
    float mix = 0.0f;
    for (int j = 0; j < k; ++j) {
      mix += __fmul_rn(__shfl_sync(kFull, sv, j) / sum, __shfl_sync(kFull, dw, j));
    }
    __syncwarp();  // the zeros are written before the chosen entries
    if (lane < k) {
      const float ds = __fmul_rn(rho / sum, dw - mix);
      dl[id] = __fmul_rn(__fmul_rn(ds, sv), 1.0f - sv);
    }
  }
}

}  // namespace

Status RouteTopKCuda(const Tensor& scores, const Tensor& bias, const Tensor& forced, double rho,
                     Tensor* ids, Tensor* weights, int64_t* bad_token) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(scores.device().index));
  const int64_t n = scores.dim(0);
  const int e = static_cast<int>(scores.dim(1)), k = static_cast<int>(ids->dim(1));
  *bad_token = -1;
  Tensor flag;
  if (forced.defined()) {
    ORRERY_ASSIGN_OR_RETURN(flag, Tensor::Allocate({1}, DType::kI32, scores.device()));
    const int init = INT_MAX;
    ORRERY_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(flag.raw_data(), &init, sizeof(int), cudaMemcpyHostToDevice, ctx->stream()),
        "route_topk flag"));
  }
  const size_t smem = forced.defined() ? 0 : sizeof(double) * kWarps * e;
  RouteTopKKernel<<<GridFor(n, kWarps), kThreads, smem, ctx->stream()>>>(
      scores.data<float>(), bias.defined() ? bias.data<float>() : nullptr,
      forced.defined() ? forced.data<int32_t>() : nullptr, n, e, k, static_cast<float>(rho),
      ids->data<int32_t>(), weights->data<float>(),
      forced.defined() ? flag.data<int32_t>() : nullptr);
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("RouteTopKKernel"));
  if (!forced.defined()) return Status::OK();
  int first = INT_MAX;
  ORRERY_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(&first, flag.raw_data(), sizeof(int), cudaMemcpyDeviceToHost, ctx->stream()),
      "route_topk flag"));
  ORRERY_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(ctx->stream()), "route_topk flag"));
  if (first != INT_MAX) *bad_token = first;
  return Status::OK();
}

Status RouteTopKGradCuda(const Tensor& scores, const Tensor& ids, const Tensor& dweights,
                         double rho, Tensor* dlogits) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(scores.device().index));
  const int64_t n = scores.dim(0);
  RouteTopKGradKernel<<<GridFor(n, kWarps), kThreads, 0, ctx->stream()>>>(
      scores.data<float>(), ids.data<int32_t>(), dweights.data<float>(), n,
      static_cast<int>(scores.dim(1)), static_cast<int>(ids.dim(1)), static_cast<float>(rho),
      dlogits->data<float>());
  return LastLaunchStatus("RouteTopKGradKernel");
}

}  // namespace orrery::kernels::cuda
