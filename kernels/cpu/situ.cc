#include "kernels/situ.h"

#include <cmath>

namespace orrery::kernels {
namespace {

template <typename T>
T Sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

}  // namespace

template <typename T>
void GluForward(const GluActivation& act, const T* a, const T* u, int64_t n, T* h) {
  const T beta = static_cast<T>(act.beta), beta_lin = static_cast<T>(act.beta_lin);
  for (int64_t i = 0; i < n; ++i) {
    const T s = Sigmoid(a[i]);
    if (!act.situ) {
      h[i] = a[i] * s * u[i];
      continue;
    }
    const T gate = beta * std::tanh(a[i] / beta) * s;
    const T up = beta_lin > 0 ? beta_lin * std::tanh(u[i] / beta_lin) : u[i];
    h[i] = gate * up;
  }
}

template <typename T>
void GluBackward(const GluActivation& act, const T* a, const T* u, const T* dh, int64_t n, T* da,
                 T* du) {
  const T beta = static_cast<T>(act.beta), beta_lin = static_cast<T>(act.beta_lin);
  for (int64_t i = 0; i < n; ++i) {
    const T s = Sigmoid(a[i]);
    if (!act.situ) {
      const T silu = a[i] * s;
      da[i] = dh[i] * u[i] * (s + a[i] * s * (T(1) - s));
      du[i] = dh[i] * silu;
      continue;
    }
    const T th = std::tanh(a[i] / beta);
    const T gate = beta * th * s;
    const T dgate = (T(1) - th * th) * s + beta * th * s * (T(1) - s);
    T up = u[i], dup = T(1);
    if (beta_lin > 0) {
      const T tu = std::tanh(u[i] / beta_lin);
      up = beta_lin * tu;
      dup = T(1) - tu * tu;
    }
    da[i] = dh[i] * up * dgate;
    du[i] = dh[i] * gate * dup;
  }
}

template void GluForward<float>(const GluActivation&, const float*, const float*, int64_t, float*);
template void GluForward<double>(const GluActivation&, const double*, const double*, int64_t,
                                 double*);
template void GluBackward<float>(const GluActivation&, const float*, const float*, const float*,
                                 int64_t, float*, float*);
template void GluBackward<double>(const GluActivation&, const double*, const double*, const double*,
                                  int64_t, double*, double*);

}  // namespace orrery::kernels
