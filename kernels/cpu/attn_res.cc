#include "kernels/attn_res.h"

#include <algorithm>
#include <cmath>

#include "core/thread_pool.h"

namespace orrery::kernels {
namespace {

template <typename T>
T Rstd(const T* v, int64_t d, double eps) {
  double ss = 0;
  for (int64_t c = 0; c < d; ++c) ss += static_cast<double>(v[c]) * v[c];
  return static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
}

}  // namespace

template <typename T>
void AttnResForward(const std::vector<const T*>& sources, int64_t rows, int64_t d, const T* w,
                    const T* gamma, double eps, T* h, T* p) {
  const int64_t n = static_cast<int64_t>(sources.size());
  std::vector<T> u(static_cast<size_t>(d));
  for (int64_t c = 0; c < d; ++c) u[c] = w[c] * gamma[c];
  ThreadPool::Default().ParallelFor(rows, 32, [&](int64_t begin, int64_t end) {
    std::vector<T> pr(static_cast<size_t>(n));
    for (int64_t t = begin; t < end; ++t) {
      T m = -INFINITY;
      for (int64_t i = 0; i < n; ++i) {
        const T* v = sources[i] + t * d;
        T dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += v[c] * u[c];
        pr[i] = dot * Rstd(v, d, eps);
        m = std::max(m, pr[i]);
      }
      T sum = 0;
      for (int64_t i = 0; i < n; ++i) sum += (pr[i] = std::exp(pr[i] - m));
      T* hr = h + t * d;
      std::fill(hr, hr + d, T(0));
      for (int64_t i = 0; i < n; ++i) {
        pr[i] /= sum;
        const T* v = sources[i] + t * d;
        for (int64_t c = 0; c < d; ++c) hr[c] += pr[i] * v[c];
        if (p) p[t * n + i] = pr[i];
      }
    }
  });
}

template <typename T>
void AttnResBackward(const std::vector<const T*>& sources, int64_t rows, int64_t d, const T* w,
                     const T* gamma, double eps, const T* p, const T* dh,
                     const std::vector<T*>& d_sources, T* dw, T* dgamma) {
  const int64_t n = static_cast<int64_t>(sources.size());
  std::vector<T> u(static_cast<size_t>(d)), du(static_cast<size_t>(d), T(0));
  for (int64_t c = 0; c < d; ++c) u[c] = w[c] * gamma[c];
  std::vector<T> dp(static_cast<size_t>(n)), ds(static_cast<size_t>(n)), r(static_cast<size_t>(n)),
      ku(static_cast<size_t>(n));
  // Serial over rows: du is a reduction and d_sources may alias across mixes.
  for (int64_t t = 0; t < rows; ++t) {
    const T* dhr = dh + t * d;
    const T* pr = p + t * n;
    T pdp = 0;
    for (int64_t i = 0; i < n; ++i) {
      const T* v = sources[i] + t * d;
      T a = 0, b = 0;
      for (int64_t c = 0; c < d; ++c) {
        a += dhr[c] * v[c];
        b += v[c] * u[c];
      }
      dp[i] = a;
      r[i] = Rstd(v, d, eps);
      ku[i] = b * r[i];  // <k_i, u>
      pdp += pr[i] * a;
    }
    for (int64_t i = 0; i < n; ++i) {
      ds[i] = pr[i] * (dp[i] - pdp);
      const T* v = sources[i] + t * d;
      for (int64_t c = 0; c < d; ++c) du[c] += ds[i] * r[i] * v[c];
      T* dv = d_sources[i];
      if (dv == nullptr) continue;
      dv += t * d;
      const T coef = ds[i] * r[i];
      const T kuD = ku[i] / static_cast<T>(d);
      for (int64_t c = 0; c < d; ++c) {
        dv[c] += pr[i] * dhr[c] + coef * (u[c] - r[i] * v[c] * kuD);
      }
    }
  }
  for (int64_t c = 0; c < d; ++c) {
    dw[c] += du[c] * gamma[c];
    dgamma[c] += du[c] * w[c];
  }
}

#define ORRERY_INSTANTIATE(T)                                                                    \
  template void AttnResForward<T>(const std::vector<const T*>&, int64_t, int64_t, const T*,      \
                                  const T*, double, T*, T*);                                     \
  template void AttnResBackward<T>(const std::vector<const T*>&, int64_t, int64_t, const T*,     \
                                   const T*, double, const T*, const T*, const std::vector<T*>&, \
                                   T*, T*);
ORRERY_INSTANTIATE(float)
ORRERY_INSTANTIATE(double)
#undef ORRERY_INSTANTIATE

}  // namespace orrery::kernels
