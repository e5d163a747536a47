#include "kernels/kda_transforms.h"

#include <cmath>
#include <string>

#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/kda_cuda.h"
#endif

namespace orrery::kernels {
namespace {

// sigmoid over a CPU tensor, f32 or f64.
template <typename T>
Tensor SigmoidOf(const Tensor& x) {
  Tensor y = Tensor::Empty(x.shape(), x.dtype());
  for (int64_t i = 0; i < x.numel(); ++i) {
    y.data<T>()[i] = T(1) / (T(1) + std::exp(-x.data<T>()[i]));
  }
  return y;
}

// d logit = d beta * beta (1 - beta), in place.
template <typename T>
void SigmoidBackwardInPlace(const Tensor& beta, Tensor* d) {
  for (int64_t i = 0; i < beta.numel(); ++i) {
    const T b = beta.data<T>()[i];
    d->data<T>()[i] *= b * (T(1) - b);
  }
}

StatusOr<KdaTransformed> ApplyCpu(const KdaInputs& raw, const KdaInputTransforms& t) {
  KdaTransformed x;
  x.in = raw;
  if (t.qk_l2norm) {
    ORRERY_RETURN_IF_ERROR(KdaL2NormForward(raw.q, t.l2norm_eps, &x.in.q, &x.q_rstd));
    ORRERY_RETURN_IF_ERROR(KdaL2NormForward(raw.k, t.l2norm_eps, &x.in.k, &x.k_rstd));
  }
  if (t.beta_sigmoid) {
    x.in.beta =
        raw.beta.dtype() == DType::kF64 ? SigmoidOf<double>(raw.beta) : SigmoidOf<float>(raw.beta);
  }
  if (t.gate) {
    ORRERY_RETURN_IF_ERROR(
        KdaGateForward(raw.g, raw.a_log, raw.dt_bias, t.gate_kind, t.gate_lower_bound, &x.in.g));
  }
  return x;
}

Status ChainCpu(const KdaInputs& raw, const KdaTransformed& x, const KdaInputTransforms& t,
                KdaGrads* grads) {
  if (t.qk_l2norm) {
    Tensor dq, dk;
    ORRERY_RETURN_IF_ERROR(KdaL2NormBackward(x.in.q, x.q_rstd, grads->dq, &dq));
    ORRERY_RETURN_IF_ERROR(KdaL2NormBackward(x.in.k, x.k_rstd, grads->dk, &dk));
    grads->dq = dq;
    grads->dk = dk;
  }
  if (t.beta_sigmoid) {
    if (x.in.beta.dtype() == DType::kF64) {
      SigmoidBackwardInPlace<double>(x.in.beta, &grads->dbeta);
    } else {
      SigmoidBackwardInPlace<float>(x.in.beta, &grads->dbeta);
    }
  }
  if (t.gate) {
    Tensor dz;
    ORRERY_RETURN_IF_ERROR(KdaGateBackward(raw.g, raw.a_log, raw.dt_bias, t.gate_kind,
                                           t.gate_lower_bound, grads->dg, &dz, &grads->da_log,
                                           &grads->ddt_bias));
    grads->dg = dz;
  }
  return Status::OK();
}

Status ExpectParam(const char* name, const Tensor& t, const Shape& shape, DType dtype,
                   const Device& device) {
  if (t.shape() != shape || t.dtype() != dtype || !(t.device() == device)) {
    return InvalidArgumentError("kda: " + std::string(name) + " " + t.ToString() + ", expected " +
                                std::string(DTypeName(dtype)) + ShapeToString(shape) + " on " +
                                device.ToString() + " (transforms.gate)");
  }
  return Status::OK();
}

}  // namespace

Status ValidateKdaTransformInputs(const KdaProblem& p, const KdaInputs& raw,
                                  const KdaInputTransforms& t) {
  if (!t.gate && (raw.a_log.defined() || raw.dt_bias.defined())) {
    return InvalidArgumentError(
        "kda: a_log / dt_bias given but transforms.gate is off (they belong to the gate's "
        "activation in the op)");
  }
  if (!t.any()) return Status::OK();
  if (!(t.l2norm_eps >= 0.0f && std::isfinite(t.l2norm_eps))) {
    return InvalidArgumentError("kda: transforms.l2norm_eps " + std::to_string(t.l2norm_eps) +
                                ", expected a finite number >= 0");
  }
  if (!t.gate) return Status::OK();
  if (t.gate_kind == KdaGateKind::kBounded &&
      !(t.gate_lower_bound < 0.0f && std::isfinite(t.gate_lower_bound))) {
    return InvalidArgumentError("kda: transforms.gate_lower_bound " +
                                std::to_string(t.gate_lower_bound) +
                                ", expected a finite negative number");
  }
  const DType param = p.dtype == DType::kF64 ? DType::kF64 : DType::kF32;
  if (raw.a_log.defined()) {
    ORRERY_RETURN_IF_ERROR(ExpectParam("a_log", raw.a_log, {p.heads}, param, p.device));
  }
  if (raw.dt_bias.defined()) {
    ORRERY_RETURN_IF_ERROR(
        ExpectParam("dt_bias", raw.dt_bias, {p.heads * p.key_dim}, param, p.device));
  }
  return Status::OK();
}

StatusOr<KdaTransformed> ApplyKdaInputTransforms(const KdaProblem& p, const KdaInputs& raw,
                                                 const KdaInputTransforms& t) {
  if (p.device.is_cpu()) return ApplyCpu(raw, t);
#if defined(ORRERY_KERNELS_CUDA)
  KdaTransformed x;
  x.in = raw;
  ORRERY_RETURN_IF_ERROR(cuda::KdaTransformInputsCuda(p, raw, t, &x.in, &x.q_rstd, &x.k_rstd));
  return x;
#else
  return FailedPreconditionError("kda: inputs are on " + p.device.ToString() +
                                 " but this build has no CUDA kernels");
#endif
}

Status ChainKdaInputTransforms(const KdaProblem& p, const KdaInputs& raw, const KdaTransformed& x,
                               const KdaInputTransforms& t, KdaGrads* grads) {
  if (p.device.is_cpu()) return ChainCpu(raw, x, t, grads);
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::KdaChainTransformsCuda(p, raw, x.in, x.q_rstd, x.k_rstd, t, grads);
#else
  return FailedPreconditionError("kda: inputs are on " + p.device.ToString() +
                                 " but this build has no CUDA kernels");
#endif
}

}  // namespace orrery::kernels
