// KDA gate activation (spec §2.2) and q/k L2 normalisation (spec §2.1 step 3), CPU, f32 and f64.
#include <cmath>
#include <string>

#include "kernels/kda.h"

namespace orrery::kernels {
namespace {

Status CheckGateArgs(const Tensor& z, const Tensor& a_log, const Tensor& dt_bias, float g_min,
                     KdaGateKind kind) {
  if (!z.defined() || z.ndim() < 2) {
    return InvalidArgumentError("kda gate: z " +
                                (z.defined() ? z.ToString() : std::string("missing")) +
                                ", expected [.., H, K]");
  }
  if (!z.device().is_cpu() || (z.dtype() != DType::kF32 && z.dtype() != DType::kF64)) {
    return InvalidArgumentError("kda gate: z " + z.ToString() + ", expected f32 or f64 on cpu");
  }
  const int64_t h = z.dim(-2), k = z.dim(-1);
  if (a_log.defined() &&
      (a_log.shape() != Shape{h} || a_log.dtype() != z.dtype() || !a_log.device().is_cpu())) {
    return InvalidArgumentError("kda gate: a_log " + a_log.ToString() + ", expected " +
                                std::string(DTypeName(z.dtype())) + "[" + std::to_string(h) +
                                "] on cpu");
  }
  if (dt_bias.defined() && (dt_bias.shape() != Shape{h * k} || dt_bias.dtype() != z.dtype() ||
                            !dt_bias.device().is_cpu())) {
    return InvalidArgumentError("kda gate: dt_bias " + dt_bias.ToString() + ", expected " +
                                std::string(DTypeName(z.dtype())) + "[" + std::to_string(h * k) +
                                "] on cpu");
  }
  if (kind == KdaGateKind::kBounded && !(g_min < 0.0f && std::isfinite(g_min))) {
    return InvalidArgumentError("kda gate: g_min " + std::to_string(g_min) +
                                ", expected a finite negative number");
  }
  return Status::OK();
}

template <typename T>
T Sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

template <typename T>
T Softplus(T x) {  // log(1 + e^x) without overflow
  return x > T(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}

template <typename T>
void GateForward(const Tensor& z, const Tensor& a_log, const Tensor& dt_bias, KdaGateKind kind,
                 T g_min, Tensor* g) {
  const int64_t h = z.dim(-2), k = z.dim(-1), rows = z.numel() / (h * k);
  const T* zp = z.data<T>();
  T* gp = g->data<T>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < h; ++i) {
      const T a = a_log.defined() ? std::exp(a_log.data<T>()[i]) : T(1);
      for (int64_t d = 0; d < k; ++d) {
        const int64_t hk = i * k + d, idx = r * h * k + hk;
        const T x = zp[idx] + (dt_bias.defined() ? dt_bias.data<T>()[hk] : T(0));
        gp[idx] = kind == KdaGateKind::kBounded ? g_min * Sigmoid(a * x) : -a * Softplus(x);
      }
    }
  }
}

template <typename T>
void GateBackward(const Tensor& z, const Tensor& a_log, const Tensor& dt_bias, KdaGateKind kind,
                  T g_min, const Tensor& dg, Tensor* dz, Tensor* da_log, Tensor* ddt_bias) {
  const int64_t h = z.dim(-2), k = z.dim(-1), rows = z.numel() / (h * k);
  const T* zp = z.data<T>();
  const T* dgp = dg.data<T>();
  T* dzp = dz->data<T>();
  T* dap = a_log.defined() ? da_log->data<T>() : nullptr;
  T* dbp = dt_bias.defined() ? ddt_bias->data<T>() : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < h; ++i) {
      const T a = a_log.defined() ? std::exp(a_log.data<T>()[i]) : T(1);
      for (int64_t d = 0; d < k; ++d) {
        const int64_t hk = i * k + d, idx = r * h * k + hk;
        const T x = zp[idx] + (dt_bias.defined() ? dt_bias.data<T>()[hk] : T(0));
        T dx, da;  // dg/dx and dg/dA_log
        if (kind == KdaGateKind::kBounded) {
          const T s = Sigmoid(a * x);
          dx = g_min * s * (T(1) - s) * a;
          da = dx * x;
        } else {
          dx = -a * Sigmoid(x);
          da = -a * Softplus(x);
        }
        dzp[idx] = dgp[idx] * dx;
        if (dbp) dbp[hk] += dgp[idx] * dx;
        if (dap) dap[i] += dgp[idx] * da;
      }
    }
  }
}

}  // namespace

Status KdaGateForward(const Tensor& z, const Tensor& a_log, const Tensor& dt_bias, KdaGateKind kind,
                      float g_min, Tensor* g) {
  ORRERY_RETURN_IF_ERROR(CheckGateArgs(z, a_log, dt_bias, g_min, kind));
  *g = Tensor::Empty(z.shape(), z.dtype());
  if (z.dtype() == DType::kF64) {
    GateForward<double>(z, a_log, dt_bias, kind, g_min, g);
  } else {
    GateForward<float>(z, a_log, dt_bias, kind, g_min, g);
  }
  return Status::OK();
}

Status KdaGateBackward(const Tensor& z, const Tensor& a_log, const Tensor& dt_bias,
                       KdaGateKind kind, float g_min, const Tensor& dg, Tensor* dz, Tensor* da_log,
                       Tensor* ddt_bias) {
  ORRERY_RETURN_IF_ERROR(CheckGateArgs(z, a_log, dt_bias, g_min, kind));
  if (!dg.defined() || dg.shape() != z.shape() || dg.dtype() != z.dtype() ||
      !dg.device().is_cpu()) {
    return InvalidArgumentError("kda gate backward: dg " +
                                (dg.defined() ? dg.ToString() : std::string("missing")) +
                                ", expected the shape and dtype of z " + z.ToString());
  }
  *dz = Tensor::Empty(z.shape(), z.dtype());
  if (a_log.defined()) *da_log = Tensor::Zeros(a_log.shape(), z.dtype());
  if (dt_bias.defined()) *ddt_bias = Tensor::Zeros(dt_bias.shape(), z.dtype());
  if (z.dtype() == DType::kF64) {
    GateBackward<double>(z, a_log, dt_bias, kind, g_min, dg, dz, da_log, ddt_bias);
  } else {
    GateBackward<float>(z, a_log, dt_bias, kind, g_min, dg, dz, da_log, ddt_bias);
  }
  return Status::OK();
}

namespace {

template <typename T>
void L2Forward(const Tensor& x, T eps, Tensor* y, Tensor* rstd) {
  const int64_t k = x.dim(-1), rows = x.numel() / k;
  const T* xp = x.data<T>();
  T* yp = y->data<T>();
  T* rp = rstd->data<T>();
  for (int64_t r = 0; r < rows; ++r) {
    T ss = 0;
    for (int64_t d = 0; d < k; ++d) ss += xp[r * k + d] * xp[r * k + d];
    const T s = T(1) / std::sqrt(ss + eps);
    rp[r] = s;
    for (int64_t d = 0; d < k; ++d) yp[r * k + d] = xp[r * k + d] * s;
  }
}

template <typename T>
void L2Backward(const Tensor& y, const Tensor& rstd, const Tensor& dy, Tensor* dx) {
  const int64_t k = y.dim(-1), rows = y.numel() / k;
  const T* yp = y.data<T>();
  const T* dyp = dy.data<T>();
  const T* rp = rstd.data<T>();
  T* dxp = dx->data<T>();
  for (int64_t r = 0; r < rows; ++r) {
    T dot = 0;
    for (int64_t d = 0; d < k; ++d) dot += yp[r * k + d] * dyp[r * k + d];
    for (int64_t d = 0; d < k; ++d) dxp[r * k + d] = rp[r] * (dyp[r * k + d] - yp[r * k + d] * dot);
  }
}

Status CheckL2(const char* what, const Tensor& x) {
  if (!x.defined() || x.ndim() < 1 || !x.device().is_cpu() ||
      (x.dtype() != DType::kF32 && x.dtype() != DType::kF64)) {
    return InvalidArgumentError(std::string("kda l2norm: ") + what + " " +
                                (x.defined() ? x.ToString() : std::string("missing")) +
                                ", expected f32 or f64 on cpu");
  }
  return Status::OK();
}

}  // namespace

Status KdaL2NormForward(const Tensor& x, float eps, Tensor* y, Tensor* rstd) {
  ORRERY_RETURN_IF_ERROR(CheckL2("x", x));
  if (!(eps >= 0.0f)) return InvalidArgumentError("kda l2norm: eps must be >= 0");
  Shape rshape = x.shape();
  rshape.pop_back();
  *y = Tensor::Empty(x.shape(), x.dtype());
  *rstd = Tensor::Empty(rshape, x.dtype());
  if (x.dtype() == DType::kF64) {
    L2Forward<double>(x, eps, y, rstd);
  } else {
    L2Forward<float>(x, eps, y, rstd);
  }
  return Status::OK();
}

Status KdaL2NormBackward(const Tensor& y, const Tensor& rstd, const Tensor& dy, Tensor* dx) {
  ORRERY_RETURN_IF_ERROR(CheckL2("y", y));
  ORRERY_RETURN_IF_ERROR(CheckL2("dy", dy));
  ORRERY_RETURN_IF_ERROR(CheckL2("rstd", rstd));
  Shape rshape = y.shape();
  rshape.pop_back();
  if (dy.shape() != y.shape() || dy.dtype() != y.dtype() || rstd.shape() != rshape ||
      rstd.dtype() != y.dtype()) {
    return InvalidArgumentError("kda l2norm backward: y " + y.ToString() + ", dy " + dy.ToString() +
                                ", rstd " + rstd.ToString() + ", expected dy like y and rstd " +
                                ShapeToString(rshape));
  }
  *dx = Tensor::Empty(y.shape(), y.dtype());
  if (y.dtype() == DType::kF64) {
    L2Backward<double>(y, rstd, dy, dx);
  } else {
    L2Backward<float>(y, rstd, dy, dx);
  }
  return Status::OK();
}

}  // namespace orrery::kernels
