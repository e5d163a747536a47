// The optimizer step's ops: checks, then the CPU twin (the formula of learner/adamw.cc) or CUDA.
#include "kernels/adamw_op.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/elementwise_check.h"
#include "kernels/phase_profile.h"
#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/ops_cuda.h"
#endif

namespace orrery::kernels {
namespace {

Status ExpectF32(const char* op, const char* name, const Tensor& t) {
  if (!t.defined() || t.dtype() != DType::kF32) {
    return InvalidArgumentError(std::string(op) + ": " + name + " " +
                                (t.defined() ? t.ToString() : "undefined") + ", expected f32");
  }
  return Status::OK();
}

}  // namespace

Status SquaredNorm(const std::vector<Tensor>& xs, Tensor* sumsq) {
  PhaseScope phase("op.squared_norm");
  if (xs.empty()) return InvalidArgumentError("squared_norm: no tensors");
  const Device device = xs[0].device();
  for (const Tensor& x : xs) {
    ORRERY_RETURN_IF_ERROR(ExpectF32("squared_norm", "x", x));
    if (!(x.device() == device)) {
      return InvalidArgumentError("squared_norm: " + x.ToString() + " is not on " +
                                  device.ToString());
    }
  }
  ORRERY_RETURN_IF_ERROR(AllocateAs("squared_norm", "sumsq", {1}, DType::kF64, device, sumsq));
  if (device.is_cpu()) {
    double sum = 0;  // f64 in a fixed order, as learner/adamw.cc's GlobalGradNorm
    for (const Tensor& x : xs) {
      const float* p = x.data<float>();
      for (int64_t i = 0; i < x.numel(); ++i) sum += static_cast<double>(p[i]) * p[i];
    }
    *sumsq->data<double>() = sum;
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::SquaredNormCuda(xs, sumsq);
#else
  return NoCuda("squared_norm", xs[0]);
#endif
}

Status ClipFactor(const Tensor& sumsq, double max_norm, Tensor* factor) {
  if (!sumsq.defined() || sumsq.dtype() != DType::kF64 || sumsq.numel() != 1) {
    return InvalidArgumentError("clip_factor: sumsq must be f64 [1] from SquaredNorm");
  }
  ORRERY_RETURN_IF_ERROR(
      AllocateAs("clip_factor", "factor", {1}, DType::kF32, sumsq.device(), factor));
  if (sumsq.device().is_cpu()) {
    const double norm = std::sqrt(*sumsq.data<double>());
    *factor->data<float>() =
        max_norm > 0 && norm > max_norm ? static_cast<float>(max_norm / (norm + 1e-12)) : 1.0f;
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::ClipFactorCuda(sumsq, max_norm, factor);
#else
  return NoCuda("clip_factor", sumsq);
#endif
}

Status AdamWStep(const AdamWStepArgs& args, const Tensor& grad, const Tensor& grad_factor,
                 Tensor* param, Tensor* m, Tensor* v, Tensor* param_bf16) {
  PhaseScope phase("op.adamw_step");
  constexpr const char* kOp = "adamw";
  if (args.step < 1 || args.beta1 < 0 || args.beta1 >= 1 || args.beta2 < 0 || args.beta2 >= 1 ||
      args.eps <= 0 || args.weight_decay < 0) {
    return InvalidArgumentError(
        "adamw: step >= 1, betas in [0, 1), eps > 0 and weight_decay >= 0 are required");
  }
  if (param == nullptr || m == nullptr || v == nullptr) {
    return InvalidArgumentError("adamw: param, m and v are required");
  }
  ORRERY_RETURN_IF_ERROR(ExpectF32(kOp, "grad", grad));
  ORRERY_RETURN_IF_ERROR(ExpectLike(kOp, "param", *param, grad));
  ORRERY_RETURN_IF_ERROR(ExpectLike(kOp, "m", *m, grad));
  ORRERY_RETURN_IF_ERROR(ExpectLike(kOp, "v", *v, grad));
  if (grad_factor.defined() && (grad_factor.dtype() != DType::kF32 || grad_factor.numel() != 1 ||
                                !(grad_factor.device() == grad.device()))) {
    return InvalidArgumentError("adamw: grad_factor " + grad_factor.ToString() +
                                ", expected f32 [1] on " + grad.device().ToString());
  }
  const bool with_bf16 = param_bf16 != nullptr && param_bf16->defined();
  if (with_bf16) {
    if (grad.device().is_cpu()) return InvalidArgumentError("adamw: param_bf16 is for cuda only");
    ORRERY_RETURN_IF_ERROR(
        AllocateAs(kOp, "param_bf16", grad.shape(), DType::kBF16, grad.device(), param_bf16));
  }
  if (grad.numel() == 0) return Status::OK();
  if (grad.device().is_cpu()) {
    const float f = grad_factor.defined() ? *grad_factor.data<float>() : 1.0f;
    const float b1 = static_cast<float>(args.beta1), b2 = static_cast<float>(args.beta2);
    const double bc1 = 1.0 - std::pow(args.beta1, static_cast<double>(args.step));
    const double bc2 = 1.0 - std::pow(args.beta2, static_cast<double>(args.step));
    const float step_size = static_cast<float>(args.lr / bc1);
    const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
    const float eps = static_cast<float>(args.eps);
    const float decay = static_cast<float>(1.0 - args.lr * args.weight_decay);
    float* w = param->data<float>();
    float* mm = m->data<float>();
    float* vv = v->data<float>();
    const float* g = grad.data<float>();
    for (int64_t i = 0; i < grad.numel(); ++i) {
      const float gi = g[i] * f;
      mm[i] = b1 * mm[i] + (1.0f - b1) * gi;
      vv[i] = b2 * vv[i] + (1.0f - b2) * gi * gi;
      w[i] = w[i] * decay - step_size * mm[i] / (std::sqrt(vv[i]) * inv_sqrt_bc2 + eps);
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  Tensor none;
  return cuda::AdamWStepCuda(args, grad, grad_factor, param, m, v, with_bf16 ? param_bf16 : &none);
#else
  return NoCuda(kOp, grad);
#endif
}

}  // namespace orrery::kernels
