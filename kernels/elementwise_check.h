// Argument checks shared by the Tensor-level ops' dispatchers (kernels/*_op.cc): each failure is
// one InvalidArgument line naming the op, the tensor and what was expected.
#pragma once

#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

inline Status ExpectLike(const char* op, const char* name, const Tensor& t, const Tensor& ref) {
  if (!t.defined()) return InvalidArgumentError(std::string(op) + ": " + name + " is undefined");
  if (t.shape() != ref.shape() || t.dtype() != ref.dtype() || !(t.device() == ref.device())) {
    return InvalidArgumentError(std::string(op) + ": " + name + " " + t.ToString() + ", expected " +
                                ref.ToString());
  }
  return Status::OK();
}

// Allocates *out like `ref` (shape, dtype, device) when undefined, else checks it matches.
inline Status AllocateLike(const char* op, const char* name, const Tensor& ref, Tensor* out) {
  if (!out->defined()) {
    ORRERY_ASSIGN_OR_RETURN(*out, Tensor::Allocate(ref.shape(), ref.dtype(), ref.device()));
    return Status::OK();
  }
  return ExpectLike(op, name, *out, ref);
}

// Checks that t is defined with `shape` and `dtype` on `device`.
inline Status ExpectAs(const char* op, const char* name, const Tensor& t, const Shape& shape,
                       DType dtype, Device device) {
  if (!t.defined() || t.shape() != shape || t.dtype() != dtype || !(t.device() == device)) {
    return InvalidArgumentError(std::string(op) + ": " + name + " " +
                                (t.defined() ? t.ToString() : std::string("undefined")) +
                                ", expected " + std::string(DTypeName(dtype)) +
                                ShapeToString(shape) + " on " + device.ToString());
  }
  return Status::OK();
}

// Allocates *out with `shape`/`dtype` on `device` when undefined, else checks it.
inline Status AllocateAs(const char* op, const char* name, const Shape& shape, DType dtype,
                         Device device, Tensor* out) {
  if (!out->defined()) {
    ORRERY_ASSIGN_OR_RETURN(*out, Tensor::Allocate(shape, dtype, device));
    return Status::OK();
  }
  return ExpectAs(op, name, *out, shape, dtype, device);
}

// The LM head ops' operands (kernels/lm_head_loss.h, lm_head_policy_loss.h): x [N, d] and
// w [V, d] of one dtype on one device, f32 or f64 on cpu, bf16 or f32 on cuda.
inline Status ExpectLmHeadOperands(const char* op, const Tensor& x, const Tensor& w) {
  if (!x.defined() || !w.defined() || x.ndim() != 2 || w.ndim() != 2 || x.dim(1) != w.dim(1)) {
    return InvalidArgumentError(
        std::string(op) + ": x " + (x.defined() ? x.ToString() : std::string("undefined")) +
        " and w " + (w.defined() ? w.ToString() : std::string("undefined")) +
        ": expected x [N, d] and w [V, d]");
  }
  const bool cpu = x.device().is_cpu();
  const DType dt = x.dtype();
  if (cpu ? (dt != DType::kF32 && dt != DType::kF64) : (dt != DType::kF32 && dt != DType::kBF16)) {
    return InvalidArgumentError(
        std::string(op) + ": x " + x.ToString() +
        (cpu ? ", expected f32 or f64 on cpu" : ", expected bf16 or f32 on cuda"));
  }
  return ExpectAs(op, "w", w, w.shape(), dt, x.device());
}

inline Status NoCuda(const char* op, const Tensor& t) {
  return FailedPreconditionError(std::string(op) + ": " + t.ToString() +
                                 ": this build has no CUDA kernels");
}

}  // namespace orrery::kernels
