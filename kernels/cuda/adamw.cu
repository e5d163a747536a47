// The optimizer step on the device (kernels/adamw_op.h): the squared gradient norm (block sums
// in f32, added across blocks and tensors in f64 by atomics, so its last bits depend on the order
// of blocks), the clipping factor, and the AdamW update of one parameter with the factor read
// from device memory, so clipping needs no host round trip.
// Not yet timed: correct first (issue 22); one launch per parameter, to be batched over
// parameters (a multi-tensor launch) once the GPU model's step is profiled.
#include <cmath>

#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void SquaredNormKernel(const float* __restrict__ x, int64_t n, double* sumsq) {
  __shared__ float warp_sums[kThreads / 32];
  float s = 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    s += x[i] * x[i];
  }
  s = WarpSum(s);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    atomicAdd(sumsq, total);
  }
}

__global__ void ClipFactorKernel(const double* sumsq, double max_norm, float* factor) {
  const double norm = sqrt(*sumsq);
  *factor = max_norm > 0 && norm > max_norm ? static_cast<float>(max_norm / (norm + 1e-12)) : 1.0f;
}

struct AdamWScalars {
  float b1, b2, eps, step_size, inv_sqrt_bc2, decay;
};

// The CPU twin's expression order, so f32 results agree to rounding of the same operations.
__global__ void AdamWKernel(AdamWScalars c, const float* __restrict__ g,
                            const float* __restrict__ factor, int64_t n, float* __restrict__ w,
                            float* __restrict__ m, float* __restrict__ v,
                            __nv_bfloat16* __restrict__ w_bf16) {
  const float f = factor != nullptr ? *factor : 1.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float gi = g[i] * f;
    const float mi = c.b1 * m[i] + (1.0f - c.b1) * gi;
    const float vi = c.b2 * v[i] + (1.0f - c.b2) * gi * gi;
    const float wi = w[i] * c.decay - c.step_size * mi / (sqrtf(vi) * c.inv_sqrt_bc2 + c.eps);
    m[i] = mi;
    v[i] = vi;
    w[i] = wi;
    if (w_bf16 != nullptr) w_bf16[i] = __float2bfloat16(wi);
  }
}

}  // namespace

Status SquaredNormCuda(const std::vector<Tensor>& xs, Tensor* sumsq) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(xs[0].device().index));
  double* out = sumsq->data<double>();
  ORRERY_RETURN_IF_ERROR(
      CudaStatus(cudaMemsetAsync(out, 0, sizeof(double), ctx->stream()), "cudaMemsetAsync"));
  for (const Tensor& x : xs) {
    if (x.numel() == 0) continue;
    SquaredNormKernel<<<GridFor(x.numel(), kThreads), kThreads, 0, ctx->stream()>>>(x.data<float>(),
                                                                                    x.numel(), out);
    ORRERY_RETURN_IF_ERROR(LastLaunchStatus("SquaredNormKernel"));
  }
  return Status::OK();
}

Status ClipFactorCuda(const Tensor& sumsq, double max_norm, Tensor* factor) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(sumsq.device().index));
  ClipFactorKernel<<<1, 1, 0, ctx->stream()>>>(sumsq.data<double>(), max_norm,
                                               factor->data<float>());
  return LastLaunchStatus("ClipFactorKernel");
}

Status AdamWStepCuda(const AdamWStepArgs& args, const Tensor& grad, const Tensor& grad_factor,
                     Tensor* param, Tensor* m, Tensor* v, Tensor* param_bf16) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(grad.device().index));
  const double bc1 = 1.0 - std::pow(args.beta1, static_cast<double>(args.step));
  const double bc2 = 1.0 - std::pow(args.beta2, static_cast<double>(args.step));
  AdamWScalars c;
  c.b1 = static_cast<float>(args.beta1);
  c.b2 = static_cast<float>(args.beta2);
  c.eps = static_cast<float>(args.eps);
  c.step_size = static_cast<float>(args.lr / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.decay = static_cast<float>(1.0 - args.lr * args.weight_decay);
  const int64_t n = grad.numel();
  AdamWKernel<<<GridFor(n, kThreads), kThreads, 0, ctx->stream()>>>(
      c, grad.data<float>(), grad_factor.defined() ? grad_factor.data<float>() : nullptr, n,
      param->data<float>(), m->data<float>(), v->data<float>(),
      param_bf16->defined() ? static_cast<__nv_bfloat16*>(param_bf16->raw_data()) : nullptr);
  return LastLaunchStatus("AdamWKernel");
}

}  // namespace orrery::kernels::cuda
