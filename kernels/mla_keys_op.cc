// MlaKeysValues / MlaKeysValuesGrad: checks, then plain CPU loops or CUDA.
#include <string>

#include "kernels/elementwise_check.h"
#include "kernels/mla_keys.h"
#include "kernels/phase_profile.h"
#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/ops_cuda.h"
#endif

namespace orrery::kernels {
namespace {

constexpr const char* kOp = "mla_keys";

Status CheckDType(const char* name, const Tensor& t) {
  if (!t.defined()) return InvalidArgumentError(std::string(kOp) + ": " + name + " is undefined");
  const bool cpu = t.device().is_cpu();
  const DType dt = t.dtype();
  if (cpu ? (dt != DType::kF32 && dt != DType::kF64) : (dt != DType::kF32 && dt != DType::kBF16)) {
    return InvalidArgumentError(
        std::string(kOp) + ": " + name + " " + t.ToString() +
        (cpu ? ", expected f32 or f64 on cpu" : ", expected bf16 or f32 on cuda"));
  }
  return Status::OK();
}

template <typename T>
void Assemble(const T* kv, const T* kr, int64_t n, int64_t h, int64_t dn, int64_t dv, int64_t dr,
              T* k, T* v) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < h; ++j) {
      const T* src = kv + (t * h + j) * (dn + dv);
      T* kd = k + (t * h + j) * (dn + dr);
      for (int64_t i = 0; i < dn; ++i) kd[i] = src[i];
      for (int64_t i = 0; i < dr; ++i) kd[dn + i] = kr[t * dr + i];
      for (int64_t i = 0; i < dv; ++i) v[(t * h + j) * dv + i] = src[dn + i];
    }
  }
}

template <typename T>
void Scatter(const T* dk, const T* dvv, int64_t n, int64_t h, int64_t dn, int64_t dv, int64_t dr,
             T* dkv, T* dkr) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < dr; ++i) dkr[t * dr + i] = 0;
    for (int64_t j = 0; j < h; ++j) {
      const T* src = dk + (t * h + j) * (dn + dr);
      T* dst = dkv + (t * h + j) * (dn + dv);
      for (int64_t i = 0; i < dn; ++i) dst[i] = src[i];
      for (int64_t i = 0; i < dv; ++i) dst[dn + i] = dvv[(t * h + j) * dv + i];
      for (int64_t i = 0; i < dr; ++i) dkr[t * dr + i] += src[dn + i];
    }
  }
}

}  // namespace

Status MlaKeysValues(const Tensor& kv, const Tensor& kr, int64_t nope_dim, Tensor* k, Tensor* v) {
  PhaseScope phase("op.mla_keys");
  ORRERY_RETURN_IF_ERROR(CheckDType("kv", kv));
  if (kv.ndim() != 3 || nope_dim < 0 || nope_dim > kv.dim(2)) {
    return InvalidArgumentError(std::string(kOp) + ": kv " + kv.ToString() +
                                ", expected [N, H, dn + dv] with dn = " + std::to_string(nope_dim));
  }
  const int64_t n = kv.dim(0), h = kv.dim(1), dn = nope_dim, dv = kv.dim(2) - nope_dim;
  if (!kr.defined() || kr.ndim() != 2 || kr.dim(0) != n) {
    return InvalidArgumentError(std::string(kOp) + ": kr " +
                                (kr.defined() ? kr.ToString() : std::string("undefined")) +
                                ", expected [" + std::to_string(n) + ", dr]");
  }
  const int64_t dr = kr.dim(1);
  ORRERY_RETURN_IF_ERROR(ExpectAs(kOp, "kr", kr, {n, dr}, kv.dtype(), kv.device()));
  ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "k", {n, h, dn + dr}, kv.dtype(), kv.device(), k));
  ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "v", {n, h, dv}, kv.dtype(), kv.device(), v));
  if (n == 0) return Status::OK();
  if (kv.device().is_cpu()) {
    if (kv.dtype() == DType::kF32) {
      Assemble(kv.data<float>(), kr.data<float>(), n, h, dn, dv, dr, k->data<float>(),
               v->data<float>());
    } else {
      Assemble(kv.data<double>(), kr.data<double>(), n, h, dn, dv, dr, k->data<double>(),
               v->data<double>());
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::MlaKeysValuesCuda(kv, kr, dn, k, v);
#else
  return NoCuda(kOp, kv);
#endif
}

Status MlaKeysValuesGrad(const Tensor& dk, const Tensor& dv, int64_t nope_dim, Tensor* dkv,
                         Tensor* dkr) {
  PhaseScope phase("op.mla_keys_grad");
  ORRERY_RETURN_IF_ERROR(CheckDType("dk", dk));
  if (dk.ndim() != 3 || nope_dim < 0 || nope_dim > dk.dim(2)) {
    return InvalidArgumentError(std::string(kOp) + ": dk " + dk.ToString() +
                                ", expected [N, H, dn + dr] with dn = " + std::to_string(nope_dim));
  }
  const int64_t n = dk.dim(0), h = dk.dim(1), dn = nope_dim, dr = dk.dim(2) - nope_dim;
  if (!dv.defined() || dv.ndim() != 3) {
    return InvalidArgumentError(std::string(kOp) + ": dv " +
                                (dv.defined() ? dv.ToString() : std::string("undefined")) +
                                ", expected [N, H, dv]");
  }
  const int64_t vd = dv.dim(2);
  ORRERY_RETURN_IF_ERROR(ExpectAs(kOp, "dv", dv, {n, h, vd}, dk.dtype(), dk.device()));
  ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "dkv", {n, h, dn + vd}, dk.dtype(), dk.device(), dkv));
  ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "dkr", {n, dr}, dk.dtype(), dk.device(), dkr));
  if (n == 0) return Status::OK();
  if (dk.device().is_cpu()) {
    if (dk.dtype() == DType::kF32) {
      Scatter(dk.data<float>(), dv.data<float>(), n, h, dn, vd, dr, dkv->data<float>(),
              dkr->data<float>());
    } else {
      Scatter(dk.data<double>(), dv.data<double>(), n, h, dn, vd, dr, dkv->data<double>(),
              dkr->data<double>());
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::MlaKeysValuesGradCuda(dk, dv, dn, dkv, dkr);
#else
  return NoCuda(kOp, dk);
#endif
}

}  // namespace orrery::kernels
