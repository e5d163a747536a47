#include "kernels/rmsnorm.h"

#include <cmath>
#include <vector>

#include "core/thread_pool.h"

namespace orrery::kernels {

template <typename T>
void RmsNormForward(const T* x, const T* w, int64_t rows, int64_t d, double eps, T* y, T* rstd) {
  ThreadPool::Default().ParallelFor(rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * d;
      double ss = 0;
      for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const T rs = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
      rstd[r] = rs;
      T* yr = y + r * d;
      for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] * rs * (w ? w[i] : T(1));
    }
  });
}

template <typename T>
void RmsNormBackward(const T* x, const T* w, const T* rstd, const T* dy, int64_t rows, int64_t d,
                     T* dx, T* dw) {
  // dw is a reduction over rows: done serially (deterministic), dx in parallel.
  if (w != nullptr && dw != nullptr) {
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * d;
      const T* dyr = dy + r * d;
      for (int64_t i = 0; i < d; ++i) dw[i] += dyr[i] * xr[i] * rstd[r];
    }
  }
  ThreadPool::Default().ParallelFor(rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * d;
      const T* dyr = dy + r * d;
      T* dxr = dx + r * d;
      const T rs = rstd[r];
      double dot = 0;
      for (int64_t i = 0; i < d; ++i)
        dot += static_cast<double>(dyr[i]) * (w ? w[i] : T(1)) * xr[i];
      const T c = static_cast<T>(dot / static_cast<double>(d)) * rs * rs;
      for (int64_t i = 0; i < d; ++i) dxr[i] = rs * (dyr[i] * (w ? w[i] : T(1)) - xr[i] * c);
    }
  });
}

template void RmsNormForward<float>(const float*, const float*, int64_t, int64_t, double, float*,
                                    float*);
template void RmsNormForward<double>(const double*, const double*, int64_t, int64_t, double,
                                     double*, double*);
template void RmsNormBackward<float>(const float*, const float*, const float*, const float*,
                                     int64_t, int64_t, float*, float*);
template void RmsNormBackward<double>(const double*, const double*, const double*, const double*,
                                      int64_t, int64_t, double*, double*);

}  // namespace orrery::kernels
