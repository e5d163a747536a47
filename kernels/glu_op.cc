// Glu / GluGrad: checks, then the CPU templates (kernels/cpu/situ.cc) or CUDA.
#include <string>

#include "kernels/elementwise_check.h"
#include "kernels/phase_profile.h"
#include "kernels/situ.h"
#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/ops_cuda.h"
#endif

namespace orrery::kernels {
namespace {

constexpr const char* kOp = "glu";

Status CheckA(const Tensor& a) {
  if (!a.defined()) return InvalidArgumentError("glu: a is undefined");
  const bool cpu = a.device().is_cpu();
  const DType dt = a.dtype();
  if (cpu ? (dt != DType::kF32 && dt != DType::kF64) : (dt != DType::kF32 && dt != DType::kBF16)) {
    return InvalidArgumentError(
        "glu: a " + a.ToString() +
        (cpu ? ", expected f32 or f64 on cpu" : ", expected bf16 or f32 on cuda"));
  }
  return Status::OK();
}

}  // namespace

Status Glu(const GluActivation& act, const Tensor& a, const Tensor& u, Tensor* h) {
  PhaseScope phase("op.glu");
  ORRERY_RETURN_IF_ERROR(CheckA(a));
  ORRERY_RETURN_IF_ERROR(ExpectLike(kOp, "u", u, a));
  ORRERY_RETURN_IF_ERROR(AllocateLike(kOp, "h", a, h));
  if (a.numel() == 0) return Status::OK();
  if (a.device().is_cpu()) {
    if (a.dtype() == DType::kF32) {
      GluForward<float>(act, a.data<float>(), u.data<float>(), a.numel(), h->data<float>());
    } else {
      GluForward<double>(act, a.data<double>(), u.data<double>(), a.numel(), h->data<double>());
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::GluForwardCuda(act, a, u, h);
#else
  return NoCuda(kOp, a);
#endif
}

Status GluGrad(const GluActivation& act, const Tensor& a, const Tensor& u, const Tensor& dh,
               Tensor* da, Tensor* du) {
  PhaseScope phase("op.glu_grad");
  ORRERY_RETURN_IF_ERROR(CheckA(a));
  ORRERY_RETURN_IF_ERROR(ExpectLike(kOp, "u", u, a));
  ORRERY_RETURN_IF_ERROR(ExpectLike(kOp, "dh", dh, a));
  ORRERY_RETURN_IF_ERROR(AllocateLike(kOp, "da", a, da));
  ORRERY_RETURN_IF_ERROR(AllocateLike(kOp, "du", a, du));
  if (a.numel() == 0) return Status::OK();
  if (a.device().is_cpu()) {
    if (a.dtype() == DType::kF32) {
      GluBackward<float>(act, a.data<float>(), u.data<float>(), dh.data<float>(), a.numel(),
                         da->data<float>(), du->data<float>());
    } else {
      GluBackward<double>(act, a.data<double>(), u.data<double>(), dh.data<double>(), a.numel(),
                          da->data<double>(), du->data<double>());
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::GluBackwardCuda(act, a, u, dh, da, du);
#else
  return NoCuda(kOp, a);
#endif
}

}  // namespace orrery::kernels
