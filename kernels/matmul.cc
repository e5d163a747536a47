// Matmul: checks, then the CPU twin (OpenBLAS) or cuBLASLt.
#include "kernels/matmul.h"

#include <string>

#include "kernels/gemm.h"
#include "kernels/phase_profile.h"
#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/ops_cuda.h"
#endif

namespace orrery::kernels {
namespace {

Status Bad(const std::string& what) { return InvalidArgumentError("matmul: " + what); }

}  // namespace

Status Matmul(const Tensor& a, const Tensor& b, const MatmulOptions& o, Tensor* c) {
  PhaseScope phase("op.matmul");
  if (!a.defined() || !b.defined() || c == nullptr) return Bad("a, b and c are required");
  if (a.ndim() != 2 || b.ndim() != 2) {
    return Bad("a " + a.ToString() + " and b " + b.ToString() + " must be 2-D");
  }
  const int64_t m = o.trans_a ? a.dim(1) : a.dim(0), k = o.trans_a ? a.dim(0) : a.dim(1);
  const int64_t kb = o.trans_b ? b.dim(1) : b.dim(0), n = o.trans_b ? b.dim(0) : b.dim(1);
  if (k != kb) {
    return Bad("inner dimensions differ: op(a) " + a.ToString() + " has " + std::to_string(k) +
               ", op(b) " + b.ToString() + " has " + std::to_string(kb));
  }
  if (!(a.device() == b.device())) return Bad("a and b are on different devices");
  if (a.dtype() != b.dtype()) return Bad("a and b have different dtypes");
  if (!c->defined()) {
    if (o.beta != 0.0f) return Bad("c is undefined but beta is not 0");
    ORRERY_ASSIGN_OR_RETURN(*c, Tensor::Allocate({m, n}, a.dtype(), a.device()));
  }
  if (c->shape() != Shape{m, n}) {
    return Bad("c " + c->ToString() + ", expected shape " + ShapeToString({m, n}));
  }
  if (!(c->device() == a.device())) return Bad("c is on another device than a");
  if (m == 0 || n == 0) return Status::OK();
  if (a.device().is_cpu()) {
    if (c->dtype() != a.dtype()) return Bad("on cpu a, b and c must share one dtype");
    if (a.dtype() == DType::kF32) {
      if (k == 0) {
        if (o.beta == 0.0f) return c->SetZero();
        float* p = c->data<float>();
        for (int64_t i = 0; i < c->numel(); ++i) p[i] *= o.beta;
        return Status::OK();
      }
      Gemm<float>(o.trans_a, o.trans_b, m, n, k, o.alpha, a.data<float>(), b.data<float>(), o.beta,
                  c->data<float>());
      return Status::OK();
    }
    if (a.dtype() == DType::kF64) {
      if (k == 0) {
        double* p = c->data<double>();
        for (int64_t i = 0; i < c->numel(); ++i) p[i] = o.beta == 0.0f ? 0.0 : p[i] * o.beta;
        return Status::OK();
      }
      Gemm<double>(o.trans_a, o.trans_b, m, n, k, o.alpha, a.data<double>(), b.data<double>(),
                   o.beta, c->data<double>());
      return Status::OK();
    }
    return Bad("a " + a.ToString() + ": expected f32 or f64 on cpu");
  }
#if defined(ORRERY_KERNELS_CUDA)
  const bool bf16 =
      a.dtype() == DType::kBF16 && (c->dtype() == DType::kBF16 || c->dtype() == DType::kF32);
  const bool f32 = a.dtype() == DType::kF32 && c->dtype() == DType::kF32;
  if (!bf16 && !f32) {
    return Bad("a " + a.ToString() + ", c " + c->ToString() +
               ": expected bf16 a, b with bf16 or f32 c, or all f32, on cuda");
  }
  return cuda::MatmulCuda(a, b, o, m, n, k, c);
#else
  return FailedPreconditionError("matmul: " + a.ToString() + ": this build has no CUDA kernels");
#endif
}

}  // namespace orrery::kernels
