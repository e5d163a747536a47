// SigmoidGate, Sigmoid, AddInto, CastInto, AddRowBias, RowBiasGrad: checks, then the CPU templates
// (kernels/cpu/gates.cc) or CUDA.
#include <string>

#include "core/half.h"
#include "kernels/elementwise_check.h"
#include "kernels/gates.h"
#include "kernels/phase_profile.h"
#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/ops_cuda.h"
#endif

namespace orrery::kernels {
namespace {

// x defined, in the device's compute dtypes (f32 or f64 on cpu, bf16 or f32 on cuda).
Status CheckX(const char* op, const Tensor& x) {
  if (!x.defined()) return InvalidArgumentError(std::string(op) + ": x is undefined");
  const bool cpu = x.device().is_cpu();
  const DType dt = x.dtype();
  if (cpu ? (dt != DType::kF32 && dt != DType::kF64) : (dt != DType::kF32 && dt != DType::kBF16)) {
    return InvalidArgumentError(
        std::string(op) + ": x " + x.ToString() +
        (cpu ? ", expected f32 or f64 on cpu" : ", expected bf16 or f32 on cuda"));
  }
  return Status::OK();
}

// y defined, of x's shape and device, with a dtype the caller names in `expected`.
Status CheckOut(const char* op, const Tensor& x, const Tensor* y, bool dtype_ok,
                const std::string& expected) {
  if (y == nullptr || !y->defined()) {
    return InvalidArgumentError(std::string(op) + ": y is undefined, expected " + expected);
  }
  if (y->shape() != x.shape() || !(y->device() == x.device()) || !dtype_ok) {
    return InvalidArgumentError(std::string(op) + ": y " + y->ToString() + ", expected " +
                                expected + " " + ShapeToString(x.shape()) + " on " +
                                x.device().ToString());
  }
  return Status::OK();
}

bool F32OrBf16(DType dt) { return dt == DType::kF32 || dt == DType::kBF16; }

}  // namespace

Status SigmoidGate(const Tensor& x, const Tensor& z, Tensor* y) {
  PhaseScope phase("op.sigmoid_gate");
  constexpr const char* kOp = "sigmoid_gate";
  ORRERY_RETURN_IF_ERROR(CheckX(kOp, x));
  ORRERY_RETURN_IF_ERROR(ExpectLike(kOp, "z", z, x));
  ORRERY_RETURN_IF_ERROR(AllocateLike(kOp, "y", x, y));
  if (x.numel() == 0) return Status::OK();
  if (x.device().is_cpu()) {
    if (x.dtype() == DType::kF32) {
      SigmoidGateForward<float>(x.data<float>(), z.data<float>(), x.numel(), y->data<float>());
    } else {
      SigmoidGateForward<double>(x.data<double>(), z.data<double>(), x.numel(), y->data<double>());
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::SigmoidGateForwardCuda(x, z, y);
#else
  return NoCuda(kOp, x);
#endif
}

Status SigmoidGateGrad(const Tensor& x, const Tensor& z, const Tensor& dy, Tensor* dx, Tensor* dz) {
  PhaseScope phase("op.sigmoid_gate_grad");
  constexpr const char* kOp = "sigmoid_gate";
  ORRERY_RETURN_IF_ERROR(CheckX(kOp, x));
  ORRERY_RETURN_IF_ERROR(ExpectLike(kOp, "z", z, x));
  ORRERY_RETURN_IF_ERROR(ExpectLike(kOp, "dy", dy, x));
  ORRERY_RETURN_IF_ERROR(AllocateLike(kOp, "dx", x, dx));
  ORRERY_RETURN_IF_ERROR(AllocateLike(kOp, "dz", x, dz));
  if (x.numel() == 0) return Status::OK();
  if (x.device().is_cpu()) {
    if (x.dtype() == DType::kF32) {
      SigmoidGateBackward<float>(x.data<float>(), z.data<float>(), dy.data<float>(), x.numel(),
                                 dx->data<float>(), dz->data<float>());
    } else {
      SigmoidGateBackward<double>(x.data<double>(), z.data<double>(), dy.data<double>(), x.numel(),
                                  dx->data<double>(), dz->data<double>());
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::SigmoidGateBackwardCuda(x, z, dy, dx, dz);
#else
  return NoCuda(kOp, x);
#endif
}

Status Sigmoid(const Tensor& x, Tensor* y) {
  PhaseScope phase("op.sigmoid");
  constexpr const char* kOp = "sigmoid";
  ORRERY_RETURN_IF_ERROR(CheckX(kOp, x));
  if (!y->defined()) {
    ORRERY_ASSIGN_OR_RETURN(*y, Tensor::Allocate(x.shape(), x.dtype(), x.device()));
  }
  const bool f32_scores = x.device().is_cuda() && x.dtype() == DType::kBF16;
  ORRERY_RETURN_IF_ERROR(
      CheckOut(kOp, x, y, y->dtype() == x.dtype() || (f32_scores && y->dtype() == DType::kF32),
               f32_scores ? "bf16 or f32" : std::string(DTypeName(x.dtype()))));
  if (x.numel() == 0) return Status::OK();
  if (x.device().is_cpu()) {
    if (x.dtype() == DType::kF32) {
      SigmoidForward<float>(x.data<float>(), x.numel(), y->data<float>());
    } else {
      SigmoidForward<double>(x.data<double>(), x.numel(), y->data<double>());
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::SigmoidCuda(x, y);
#else
  return NoCuda(kOp, x);
#endif
}

Status AddInto(const Tensor& x, float alpha, Tensor* y) {
  PhaseScope phase("op.add_into");
  constexpr const char* kOp = "add_into";
  if (!x.defined()) return InvalidArgumentError(std::string(kOp) + ": x is undefined");
  const bool mixed = x.dtype() == DType::kBF16;  // into f32, on either device
  if (!mixed) ORRERY_RETURN_IF_ERROR(CheckX(kOp, x));
  const bool cpu = x.device().is_cpu();
  const bool dtype_ok = y != nullptr && y->defined() &&
                        (y->dtype() == DType::kF32 ? mixed || x.dtype() == DType::kF32
                                                   : y->dtype() == x.dtype() && !(mixed && cpu));
  ORRERY_RETURN_IF_ERROR(
      CheckOut(kOp, x, y, dtype_ok,
               mixed && cpu ? std::string("f32")
                            : std::string(DTypeName(x.dtype())) + (mixed ? " or f32" : "")));
  if (x.numel() == 0) return Status::OK();
  if (x.device().is_cpu()) {
    if (mixed) {
      AddScaled<BFloat16, float>(x.data<BFloat16>(), alpha, x.numel(), y->data<float>());
    } else if (x.dtype() == DType::kF32) {
      AddScaled<float, float>(x.data<float>(), alpha, x.numel(), y->data<float>());
    } else {
      AddScaled<double, double>(x.data<double>(), alpha, x.numel(), y->data<double>());
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::AddIntoCuda(x, alpha, y);
#else
  return NoCuda(kOp, x);
#endif
}

Status AddRowBias(const Tensor& b, Tensor* y) {
  PhaseScope phase("op.add_row_bias");
  constexpr const char* kOp = "add_row_bias";
  if (y == nullptr || !y->defined()) return InvalidArgumentError("add_row_bias: y is undefined");
  ORRERY_RETURN_IF_ERROR(CheckX(kOp, *y));
  if (y->ndim() != 2 || !b.defined() || b.ndim() != 1 || b.dim(0) != y->dim(1) ||
      b.dtype() != y->dtype() || !(b.device() == y->device())) {
    return InvalidArgumentError(std::string(kOp) + ": y " + y->ToString() + ", b " +
                                (b.defined() ? b.ToString() : "undefined") +
                                ", expected y [rows, cols] and b [cols] of y's dtype and device");
  }
  if (y->numel() == 0) return Status::OK();
  if (y->device().is_cpu()) {
    if (y->dtype() == DType::kF32) {
      AddRowBiasForward<float>(b.data<float>(), y->dim(0), y->dim(1), y->data<float>());
    } else {
      AddRowBiasForward<double>(b.data<double>(), y->dim(0), y->dim(1), y->data<double>());
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::AddRowBiasCuda(b, y);
#else
  return NoCuda(kOp, *y);
#endif
}

Status RowBiasGrad(const Tensor& dy, Tensor* db) {
  PhaseScope phase("op.row_bias_grad");
  constexpr const char* kOp = "row_bias_grad";
  ORRERY_RETURN_IF_ERROR(CheckX(kOp, dy));
  const bool cpu = dy.device().is_cpu();
  const bool dtype_ok = db != nullptr && db->defined() &&
                        (db->dtype() == dy.dtype() || (!cpu && db->dtype() == DType::kF32));
  if (dy.ndim() != 2 || !dtype_ok || db->ndim() != 1 || db->dim(0) != dy.dim(1) ||
      !(db->device() == dy.device())) {
    return InvalidArgumentError(
        std::string(kOp) + ": dy " + dy.ToString() + ", db " +
        (db != nullptr && db->defined() ? db->ToString() : "undefined") +
        ", expected dy [rows, cols] and db [cols] of dy's dtype (or f32 for bf16 on cuda)");
  }
  if (dy.numel() == 0) return Status::OK();
  if (cpu) {
    if (dy.dtype() == DType::kF32) {
      RowBiasBackward<float>(dy.data<float>(), dy.dim(0), dy.dim(1), db->data<float>());
    } else {
      RowBiasBackward<double>(dy.data<double>(), dy.dim(0), dy.dim(1), db->data<double>());
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  if (db->dtype() != DType::kF32) {
    return InvalidArgumentError(std::string(kOp) + ": db " + db->ToString() +
                                ", expected f32 on cuda");
  }
  return cuda::RowBiasGradCuda(dy, db);
#else
  return NoCuda(kOp, dy);
#endif
}

Status CastInto(const Tensor& x, Tensor* y) {
  PhaseScope phase("op.cast_into");
  constexpr const char* kOp = "cast_into";
  if (!x.defined() || !F32OrBf16(x.dtype())) {
    return InvalidArgumentError(std::string(kOp) + ": x " +
                                (x.defined() ? x.ToString() : "undefined") +
                                ", expected f32 or bf16");
  }
  ORRERY_RETURN_IF_ERROR(
      CheckOut(kOp, x, y, y != nullptr && y->defined() && F32OrBf16(y->dtype()), "f32 or bf16"));
  if (x.numel() == 0) return Status::OK();
  if (x.device().is_cpu()) {
    const int64_t n = x.numel();
    if (x.dtype() == DType::kF32) {
      if (y->dtype() == DType::kF32) {
        Convert<float, float>(x.data<float>(), n, y->data<float>());
      } else {
        Convert<float, BFloat16>(x.data<float>(), n, y->data<BFloat16>());
      }
    } else if (y->dtype() == DType::kF32) {
      Convert<BFloat16, float>(x.data<BFloat16>(), n, y->data<float>());
    } else {
      Convert<BFloat16, BFloat16>(x.data<BFloat16>(), n, y->data<BFloat16>());
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::CastIntoCuda(x, y);
#else
  return NoCuda(kOp, x);
#endif
}

}  // namespace orrery::kernels
