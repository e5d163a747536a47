// RmsNorm / RmsNormGrad: checks, then the CPU templates (kernels/cpu/rmsnorm.cc) or CUDA.
#include <string>

#include "kernels/elementwise_check.h"
#include "kernels/phase_profile.h"
#include "kernels/rmsnorm.h"
#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/ops_cuda.h"
#endif

namespace orrery::kernels {
namespace {

constexpr const char* kOp = "rmsnorm";

Status CheckInputs(const Tensor& x, const Tensor& w) {
  if (!x.defined() || x.ndim() != 2) {
    return InvalidArgumentError(std::string(kOp) + ": x " +
                                (x.defined() ? x.ToString() : "undefined") + ", expected 2-D");
  }
  const bool cpu = x.device().is_cpu();
  const DType dt = x.dtype();
  if (cpu ? (dt != DType::kF32 && dt != DType::kF64) : (dt != DType::kF32 && dt != DType::kBF16)) {
    return InvalidArgumentError(
        std::string(kOp) + ": x " + x.ToString() +
        (cpu ? ", expected f32 or f64 on cpu" : ", expected bf16 or f32 on cuda"));
  }
  if (w.defined() &&
      (w.shape() != Shape{x.dim(1)} || w.dtype() != dt || !(w.device() == x.device()))) {
    return InvalidArgumentError(std::string(kOp) + ": w " + w.ToString() + ", expected " +
                                std::string(DTypeName(dt)) + "[" + std::to_string(x.dim(1)) +
                                "] on " + x.device().ToString());
  }
  return Status::OK();
}

DType RstdType(const Tensor& x) { return x.device().is_cpu() ? x.dtype() : DType::kF32; }

template <typename T>
const T* OrNull(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace

Status RmsNorm(const Tensor& x, const Tensor& w, double eps, Tensor* y, Tensor* rstd) {
  PhaseScope phase("op.rms_norm");
  ORRERY_RETURN_IF_ERROR(CheckInputs(x, w));
  ORRERY_RETURN_IF_ERROR(AllocateLike(kOp, "y", x, y));
  ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "rstd", {x.dim(0)}, RstdType(x), x.device(), rstd));
  if (x.numel() == 0) return Status::OK();
  if (x.device().is_cpu()) {
    if (x.dtype() == DType::kF32) {
      RmsNormForward<float>(x.data<float>(), OrNull<float>(w), x.dim(0), x.dim(1), eps,
                            y->data<float>(), rstd->data<float>());
    } else {
      RmsNormForward<double>(x.data<double>(), OrNull<double>(w), x.dim(0), x.dim(1), eps,
                             y->data<double>(), rstd->data<double>());
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::RmsNormForwardCuda(x, w, eps, y, rstd);
#else
  return NoCuda(kOp, x);
#endif
}

Status RmsNormGrad(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                   Tensor* dx, Tensor* dw) {
  PhaseScope phase("op.rms_norm_grad");
  ORRERY_RETURN_IF_ERROR(CheckInputs(x, w));
  ORRERY_RETURN_IF_ERROR(ExpectLike(kOp, "dy", dy, x));
  if (!rstd.defined() || rstd.shape() != Shape{x.dim(0)} || rstd.dtype() != RstdType(x) ||
      !(rstd.device() == x.device())) {
    return InvalidArgumentError(std::string(kOp) + ": rstd " +
                                (rstd.defined() ? rstd.ToString() : "undefined") + ", expected " +
                                std::string(DTypeName(RstdType(x))) + "[" +
                                std::to_string(x.dim(0)) + "] from RmsNorm");
  }
  ORRERY_RETURN_IF_ERROR(AllocateLike(kOp, "dx", x, dx));
  const bool with_dw = w.defined() && dw != nullptr;
  if (with_dw) {
    const DType dw_type = x.device().is_cpu() ? x.dtype() : DType::kF32;
    if (!dw->defined()) {
      ORRERY_ASSIGN_OR_RETURN(*dw, Tensor::Allocate({x.dim(1)}, dw_type, x.device()));
      ORRERY_RETURN_IF_ERROR(dw->SetZero());
    }
    ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "dw", {x.dim(1)}, dw_type, x.device(), dw));
  }
  if (x.numel() == 0) return Status::OK();
  if (x.device().is_cpu()) {
    if (x.dtype() == DType::kF32) {
      RmsNormBackward<float>(x.data<float>(), OrNull<float>(w), rstd.data<float>(),
                             dy.data<float>(), x.dim(0), x.dim(1), dx->data<float>(),
                             with_dw ? dw->data<float>() : nullptr);
    } else {
      RmsNormBackward<double>(x.data<double>(), OrNull<double>(w), rstd.data<double>(),
                              dy.data<double>(), x.dim(0), x.dim(1), dx->data<double>(),
                              with_dw ? dw->data<double>() : nullptr);
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  Tensor none;
  return cuda::RmsNormBackwardCuda(x, w, rstd, dy, dx, with_dw ? dw : &none);
#else
  return NoCuda(kOp, x);
#endif
}

}  // namespace orrery::kernels
