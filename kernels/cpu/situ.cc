#include "kernels/situ.h"

#include <cmath>

#include "core/thread_pool.h"
#include "kernels/cpu/fast_math.h"

namespace orrery::kernels {

using cpu::Sigmoid;
using cpu::Tanh;

// Elements per pool task: the loops are cheap per element, so only large tensors are split.
constexpr int64_t kGrain = 1 << 14;

template <typename T>
void GluForward(const GluActivation& act, const T* a, const T* u, int64_t n, T* h) {
  const T beta = static_cast<T>(act.beta), beta_lin = static_cast<T>(act.beta_lin);
  ThreadPool::Default().ParallelFor(n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T s = Sigmoid(a[i]);
      if (!act.situ) {
        h[i] = a[i] * s * u[i];
        continue;
      }
      const T gate = beta * Tanh(a[i] / beta) * s;
      const T up = beta_lin > 0 ? beta_lin * Tanh(u[i] / beta_lin) : u[i];
      h[i] = gate * up;
    }
  });
}

template <typename T>
void GluBackward(const GluActivation& act, const T* a, const T* u, const T* dh, int64_t n, T* da,
                 T* du) {
  const T beta = static_cast<T>(act.beta), beta_lin = static_cast<T>(act.beta_lin);
  ThreadPool::Default().ParallelFor(n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T s = Sigmoid(a[i]);
      if (!act.situ) {
        const T silu = a[i] * s;
        da[i] = dh[i] * u[i] * (s + a[i] * s * (T(1) - s));
        du[i] = dh[i] * silu;
        continue;
      }
      const T th = Tanh(a[i] / beta);
      const T gate = beta * th * s;
      const T dgate = (T(1) - th * th) * s + beta * th * s * (T(1) - s);
      T up = u[i], dup = T(1);
      if (beta_lin > 0) {
        const T tu = Tanh(u[i] / beta_lin);
        up = beta_lin * tu;
        dup = T(1) - tu * tu;
      }
      da[i] = dh[i] * up * dgate;
      du[i] = dh[i] * gate * dup;
    }
  });
}

template void GluForward<float>(const GluActivation&, const float*, const float*, int64_t, float*);
template void GluForward<double>(const GluActivation&, const double*, const double*, int64_t,
                                 double*);
template void GluBackward<float>(const GluActivation&, const float*, const float*, const float*,
                                 int64_t, float*, float*);
template void GluBackward<double>(const GluActivation&, const double*, const double*, const double*,
                                  int64_t, double*, double*);

}  // namespace orrery::kernels
