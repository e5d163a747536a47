// The CPU twins of the MoE ops' primitives (kernels/cpu/moe_cpu.h): model::MoeLayer's loops, in
// its operation order, on tensors, so that the twin reproduces the CPU model to rounding (and in
// the selection and the routing weights exactly).
#include <algorithm>
#include <numeric>

#include "kernels/cpu/moe_cpu.h"

namespace orrery::kernels {
namespace {

template <typename T>
void Route(const Tensor& scores, const Tensor& bias, const Tensor& forced, double rho_d,
           Tensor* ids_t, Tensor* weights_t) {
  const int64_t n = scores.dim(0), e = scores.dim(1), k = ids_t->dim(1);
  const T* s = scores.data<T>();
  const float* bias_p = bias.defined() ? bias.data<float>() : nullptr;
  int32_t* ids = ids_t->data<int32_t>();
  std::vector<int32_t> order(static_cast<size_t>(e));
  for (int64_t t = 0; t < n; ++t) {
    if (forced.defined()) {
      std::copy_n(forced.data<int32_t>() + t * k, k, ids + t * k);
      continue;
    }
    // model::SelectTopK: partial sort of the ids by (s + b) in f64, ties to the lower id.
    const T* row = s + t * e;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      const double va = static_cast<double>(row[a]) + (bias_p ? bias_p[a] : 0.0f);
      const double vb = static_cast<double>(row[b]) + (bias_p ? bias_p[b] : 0.0f);
      return va > vb || (va == vb && a < b);
    });
    std::copy(order.begin(), order.begin() + k, ids + t * k);
  }
  T* w = weights_t->data<T>();
  const T rho = static_cast<T>(rho_d);
  for (int64_t t = 0; t < n; ++t) {
    T sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += s[t * e + ids[t * k + j]];
    for (int64_t j = 0; j < k; ++j) {
      w[t * k + j] = rho * s[t * e + ids[t * k + j]] / (sum + static_cast<T>(1e-20));
    }
  }
}

template <typename T>
void RouteGrad(const Tensor& scores, const Tensor& ids_t, const Tensor& dweights, double rho_d,
               Tensor* dlogits) {
  const int64_t n = scores.dim(0), e = scores.dim(1), k = ids_t.dim(1);
  const T* s = scores.data<T>();
  const int32_t* ids = ids_t.data<int32_t>();
  const T* dw = dweights.data<T>();
  T* dlog = dlogits->data<T>();
  std::fill_n(dlog, n * e, T(0));
  const T rho = static_cast<T>(rho_d);
  for (int64_t t = 0; t < n; ++t) {
    T sum = 0, mix = 0;
    for (int64_t j = 0; j < k; ++j) sum += s[t * e + ids[t * k + j]];
    sum += static_cast<T>(1e-20);
    for (int64_t j = 0; j < k; ++j) mix += s[t * e + ids[t * k + j]] / sum * dw[t * k + j];
    for (int64_t j = 0; j < k; ++j) {
      const int64_t id = ids[t * k + j];
      const T ds = rho / sum * (dw[t * k + j] - mix);
      dlog[t * e + id] += ds * s[t * e + id] * (T(1) - s[t * e + id]);
    }
  }
}

template <typename T>
void Gather(const Tensor& xl, const Tensor& perm, int64_t k, Tensor* xg) {
  const int64_t m = perm.numel(), l = xl.dim(1);
  const int32_t* pm = perm.data<int32_t>();
  for (int64_t r = 0; r < m; ++r) {
    std::copy_n(xl.data<T>() + (pm[r] / k) * l, l, xg->data<T>() + r * l);
  }
}

template <typename T>
void Combine(const Tensor& o, const Tensor& weights, const Tensor& perm, int64_t k, Tensor* y) {
  const int64_t m = perm.numel(), l = o.dim(1);
  const int32_t* pm = perm.data<int32_t>();
  T* yp = y->data<T>();
  std::fill_n(yp, y->numel(), T(0));
  for (int64_t r = 0; r < m; ++r) {
    const T wr = weights.data<T>()[pm[r]];
    const T* src = o.data<T>() + r * l;
    T* dst = yp + (pm[r] / k) * l;
    for (int64_t i = 0; i < l; ++i) dst[i] += wr * src[i];
  }
}

template <typename T>
void CombineGrad(const Tensor& dy, const Tensor& o, const Tensor& weights, const Tensor& perm,
                 int64_t k, Tensor* doe, Tensor* dweights) {
  const int64_t m = perm.numel(), l = o.dim(1);
  const int32_t* pm = perm.data<int32_t>();
  for (int64_t r = 0; r < m; ++r) {
    const T* g = dy.data<T>() + (pm[r] / k) * l;
    const T* src = o.data<T>() + r * l;
    T* dst = doe->data<T>() + r * l;
    const T wr = weights.data<T>()[pm[r]];
    T dot = 0;
    for (int64_t i = 0; i < l; ++i) {
      dst[i] = wr * g[i];
      dot += g[i] * src[i];
    }
    dweights->data<T>()[pm[r]] = dot;
  }
}

template <typename T>
void ScatterAdd(const Tensor& dxg, const Tensor& perm, int64_t k, Tensor* dxl) {
  const int64_t m = perm.numel(), l = dxg.dim(1);
  const int32_t* pm = perm.data<int32_t>();
  for (int64_t r = 0; r < m; ++r) {
    const T* src = dxg.data<T>() + r * l;
    T* dst = dxl->data<T>() + (pm[r] / k) * l;
    for (int64_t i = 0; i < l; ++i) dst[i] += src[i];
  }
}

}  // namespace

Status RouteTopKCpu(const Tensor& scores, const Tensor& bias, const Tensor& forced, double rho,
                    Tensor* ids, Tensor* weights, int64_t* bad_token) {
  *bad_token = -1;
  if (forced.defined()) {  // MoeLayer's check: each id in [0, E), none repeated in its row
    const int64_t n = forced.dim(0), k = forced.dim(1), e = scores.dim(1);
    const int32_t* f = forced.data<int32_t>();
    for (int64_t t = 0; t < n && *bad_token < 0; ++t) {
      for (int64_t j = 0; j < k && *bad_token < 0; ++j) {
        const int32_t id = f[t * k + j];
        if (id < 0 || id >= e || std::find(f + t * k, f + t * k + j, id) != f + t * k + j) {
          *bad_token = t;
        }
      }
    }
    if (*bad_token >= 0) return Status::OK();
  }
  if (scores.dtype() == DType::kF32) {
    Route<float>(scores, bias, forced, rho, ids, weights);
  } else {
    Route<double>(scores, bias, forced, rho, ids, weights);
  }
  return Status::OK();
}

Status RouteTopKGradCpu(const Tensor& scores, const Tensor& ids, const Tensor& dweights, double rho,
                        Tensor* dlogits) {
  if (scores.dtype() == DType::kF32) {
    RouteGrad<float>(scores, ids, dweights, rho, dlogits);
  } else {
    RouteGrad<double>(scores, ids, dweights, rho, dlogits);
  }
  return Status::OK();
}

Status MoePermuteCpu(const Tensor& ids, int64_t num_experts, Tensor* perm, Tensor* rank,
                     std::vector<int64_t>* offsets, int64_t* bad_pair) {
  const int64_t m = ids.numel();
  const int32_t* id = ids.data<int32_t>();
  *bad_pair = -1;
  offsets->assign(static_cast<size_t>(num_experts + 1), 0);
  for (int64_t p = 0; p < m; ++p) {
    if (id[p] < 0 || id[p] >= num_experts) {
      *bad_pair = p;
      return Status::OK();
    }
    ++(*offsets)[id[p] + 1];
  }
  std::partial_sum(offsets->begin(), offsets->end(), offsets->begin());
  std::vector<int64_t> next(offsets->begin(), offsets->end() - 1);
  for (int64_t p = 0; p < m; ++p) {
    const int64_t row = next[id[p]]++;
    perm->data<int32_t>()[row] = static_cast<int32_t>(p);
    rank->data<int32_t>()[p] = static_cast<int32_t>(row);
  }
  return Status::OK();
}

Status MoeGatherCpu(const Tensor& xl, const Tensor& perm, int64_t top_k, Tensor* xg) {
  if (xl.dtype() == DType::kF32) {
    Gather<float>(xl, perm, top_k, xg);
  } else {
    Gather<double>(xl, perm, top_k, xg);
  }
  return Status::OK();
}

Status MoeCombineCpu(const Tensor& o, const Tensor& weights, const Tensor& perm, int64_t top_k,
                     Tensor* y) {
  if (o.dtype() == DType::kF32) {
    Combine<float>(o, weights, perm, top_k, y);
  } else {
    Combine<double>(o, weights, perm, top_k, y);
  }
  return Status::OK();
}

Status MoeCombineGradCpu(const Tensor& dy, const Tensor& o, const Tensor& weights,
                         const Tensor& perm, int64_t top_k, Tensor* doe, Tensor* dweights) {
  if (o.dtype() == DType::kF32) {
    CombineGrad<float>(dy, o, weights, perm, top_k, doe, dweights);
  } else {
    CombineGrad<double>(dy, o, weights, perm, top_k, doe, dweights);
  }
  return Status::OK();
}

Status MoeScatterAddCpu(const Tensor& dxg, const Tensor& perm, int64_t top_k, Tensor* dxl) {
  if (dxg.dtype() == DType::kF32) {
    ScatterAdd<float>(dxg, perm, top_k, dxl);
  } else {
    ScatterAdd<double>(dxg, perm, top_k, dxl);
  }
  return Status::OK();
}

}  // namespace orrery::kernels
