// MLA key/value assembly and its backward (kernels/mla_keys.h): one thread per output element,
// the shared rope key broadcast to every head; the backward sums it over heads per (token, i) in
// f32. Memory-bound copies; not yet timed (issue 22: correct first; the MLA issue's attention
// kernel reads kv and kr directly and makes both passes disappear).
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void AssembleKernel(const T* __restrict__ kv, const T* __restrict__ kr, int64_t n,
                               int64_t h, int64_t dn, int64_t dv, int64_t dr, T* __restrict__ k,
                               T* __restrict__ v) {
  const int64_t wk = dn + dr, total = n * h * (wk + dv);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / (wk + dv), c = i % (wk + dv);  // row = t * h + head
    const int64_t t = row / h;
    if (c < dn) {
      k[row * wk + c] = kv[row * (dn + dv) + c];
    } else if (c < wk) {
      k[row * wk + c] = kr[t * dr + (c - dn)];
    } else {
      v[row * dv + (c - wk)] = kv[row * (dn + dv) + dn + (c - wk)];
    }
  }
}

template <typename T>
__global__ void ScatterKernel(const T* __restrict__ dk, const T* __restrict__ dvv, int64_t n,
                              int64_t h, int64_t dn, int64_t dv, int64_t dr, T* __restrict__ dkv,
                              T* __restrict__ dkr) {
  const int64_t wk = dn + dr, wkv = dn + dv;
  const int64_t copies = n * h * wkv, total = copies + n * dr;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (i < copies) {
      const int64_t row = i / wkv, c = i % wkv;
      dkv[i] = c < dn ? dk[row * wk + c] : dvv[row * dv + (c - dn)];
    } else {
      const int64_t j = i - copies, t = j / dr, c = j % dr;
      float acc = 0.0f;
      for (int64_t head = 0; head < h; ++head) acc += ToF(dk[(t * h + head) * wk + dn + c]);
      dkr[j] = FromF<T>(acc);
    }
  }
}

}  // namespace

Status MlaKeysValuesCuda(const Tensor& kv, const Tensor& kr, int64_t dn, Tensor* k, Tensor* v) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(kv.device().index));
  const int64_t n = kv.dim(0), h = kv.dim(1), dv = kv.dim(2) - dn, dr = kr.dim(1);
  const unsigned grid = GridFor(n * h * (dn + dr + dv), kThreads);
  if (kv.dtype() == DType::kBF16) {
    using B = __nv_bfloat16;
    AssembleKernel<B><<<grid, kThreads, 0, ctx->stream()>>>(
        static_cast<const B*>(kv.raw_data()), static_cast<const B*>(kr.raw_data()), n, h, dn, dv,
        dr, static_cast<B*>(k->raw_data()), static_cast<B*>(v->raw_data()));
  } else {
    AssembleKernel<float><<<grid, kThreads, 0, ctx->stream()>>>(
        static_cast<const float*>(kv.raw_data()), static_cast<const float*>(kr.raw_data()), n, h,
        dn, dv, dr, static_cast<float*>(k->raw_data()), static_cast<float*>(v->raw_data()));
  }
  return LastLaunchStatus("MlaKeysValues AssembleKernel");
}

Status MlaKeysValuesGradCuda(const Tensor& dk, const Tensor& dv, int64_t dn, Tensor* dkv,
                             Tensor* dkr) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(dk.device().index));
  const int64_t n = dk.dim(0), h = dk.dim(1), dr = dk.dim(2) - dn, vd = dv.dim(2);
  const unsigned grid = GridFor(n * h * (dn + vd) + n * dr, kThreads);
  if (dk.dtype() == DType::kBF16) {
    using B = __nv_bfloat16;
    ScatterKernel<B><<<grid, kThreads, 0, ctx->stream()>>>(
        static_cast<const B*>(dk.raw_data()), static_cast<const B*>(dv.raw_data()), n, h, dn, vd,
        dr, static_cast<B*>(dkv->raw_data()), static_cast<B*>(dkr->raw_data()));
  } else {
    ScatterKernel<float><<<grid, kThreads, 0, ctx->stream()>>>(
        static_cast<const float*>(dk.raw_data()), static_cast<const float*>(dv.raw_data()), n, h,
        dn, vd, dr, static_cast<float*>(dkv->raw_data()), static_cast<float*>(dkr->raw_data()));
  }
  return LastLaunchStatus("MlaKeysValues ScatterKernel");
}

}  // namespace orrery::kernels::cuda
