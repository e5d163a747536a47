// SiTU-GLU and SiLU-GLU forward and backward, element-wise (kernels/situ.h), in f32 arithmetic on
// bf16 or f32 storage with the CPU twin's formulas (precise expf/tanhf, not the fast intrinsics:
// the bound |h| < beta beta_lin is what SiTU is for, so the caps must be exact).
// Not yet timed: correct first (issue 22). The forward's formula (glu_value.cuh) is also the fused
// epilogue of GroupedGemmGlu (kernels/grouped_gemm.h, issue 24).
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/glu_value.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void GluForwardKernel(GluParams p, const T* __restrict__ a, const T* __restrict__ u,
                                 int64_t n, T* __restrict__ h) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    h[i] = FromF<T>(GluValue(p, ToF(a[i]), ToF(u[i])));
  }
}

template <typename T>
__global__ void GluBackwardKernel(GluParams p, const T* __restrict__ a, const T* __restrict__ u,
                                  const T* __restrict__ dh, int64_t n, T* __restrict__ da,
                                  T* __restrict__ du) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float av = ToF(a[i]), uv = ToF(u[i]), g = ToF(dh[i]);
    const float s = Sigmoid(av);
    float dav, duv;
    if (!p.situ) {
      dav = g * uv * (s + av * s * (1.0f - s));
      duv = g * av * s;
    } else {
      const float th = tanhf(av / p.beta);
      const float gate = p.beta * th * s;
      const float dgate = (1.0f - th * th) * s + p.beta * th * s * (1.0f - s);
      float up = uv, dup = 1.0f;
      if (p.beta_lin > 0) {
        const float tu = tanhf(uv / p.beta_lin);
        up = p.beta_lin * tu;
        dup = 1.0f - tu * tu;
      }
      dav = g * up * dgate;
      duv = g * gate * dup;
    }
    da[i] = FromF<T>(dav);
    du[i] = FromF<T>(duv);
  }
}

GluParams ParamsOf(const GluActivation& act) {
  return {act.situ, static_cast<float>(act.beta), static_cast<float>(act.beta_lin)};
}

template <typename T>
const T* In(const Tensor& t) {
  return static_cast<const T*>(t.raw_data());
}
template <typename T>
T* Out(Tensor* t) {
  return static_cast<T*>(t->raw_data());
}

}  // namespace

Status GluForwardCuda(const GluActivation& act, const Tensor& a, const Tensor& u, Tensor* h) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(a.device().index));
  const int64_t n = a.numel();
  const unsigned grid = GridFor(n, kThreads);
  if (a.dtype() == DType::kBF16) {
    GluForwardKernel<__nv_bfloat16><<<grid, kThreads, 0, ctx->stream()>>>(
        ParamsOf(act), In<__nv_bfloat16>(a), In<__nv_bfloat16>(u), n, Out<__nv_bfloat16>(h));
  } else {
    GluForwardKernel<float><<<grid, kThreads, 0, ctx->stream()>>>(ParamsOf(act), In<float>(a),
                                                                  In<float>(u), n, Out<float>(h));
  }
  return LastLaunchStatus("GluForwardKernel");
}

Status GluBackwardCuda(const GluActivation& act, const Tensor& a, const Tensor& u, const Tensor& dh,
                       Tensor* da, Tensor* du) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(a.device().index));
  const int64_t n = a.numel();
  const unsigned grid = GridFor(n, kThreads);
  if (a.dtype() == DType::kBF16) {
    GluBackwardKernel<__nv_bfloat16><<<grid, kThreads, 0, ctx->stream()>>>(
        ParamsOf(act), In<__nv_bfloat16>(a), In<__nv_bfloat16>(u), In<__nv_bfloat16>(dh), n,
        Out<__nv_bfloat16>(da), Out<__nv_bfloat16>(du));
  } else {
    GluBackwardKernel<float><<<grid, kThreads, 0, ctx->stream()>>>(ParamsOf(act), In<float>(a),
                                                                   In<float>(u), In<float>(dh), n,
                                                                   Out<float>(da), Out<float>(du));
  }
  return LastLaunchStatus("GluBackwardKernel");
}

}  // namespace orrery::kernels::cuda
