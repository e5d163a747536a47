#include "kernels/gates.h"

#include <algorithm>

#include "core/half.h"
#include "core/thread_pool.h"
#include "kernels/cpu/fast_math.h"

namespace orrery::kernels {
namespace {

using cpu::Sigmoid;

// Elements per pool task: the loops are cheap per element, so only large tensors are split.
constexpr int64_t kGrain = 1 << 14;

// Storage to arithmetic (float for f32 and bf16, double for f64) and back.
inline float Load(float v) { return v; }
inline double Load(double v) { return v; }
inline float Load(BFloat16 v) { return BFloat16ToFloat(v); }
template <typename Y>
Y Store(float v);
template <>
float Store<float>(float v) {
  return v;
}
template <>
BFloat16 Store<BFloat16>(float v) {
  return FloatToBFloat16(v);
}

}  // namespace

template <typename T>
void SigmoidGateForward(const T* x, const T* z, int64_t n, T* y) {
  ThreadPool::Default().ParallelFor(n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = x[i] * Sigmoid(z[i]);
  });
}

template <typename T>
void SigmoidGateBackward(const T* x, const T* z, const T* dy, int64_t n, T* dx, T* dz) {
  ThreadPool::Default().ParallelFor(n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T s = Sigmoid(z[i]);
      dx[i] = dy[i] * s;
      dz[i] = dy[i] * x[i] * s * (T(1) - s);
    }
  });
}

template <typename T>
void SigmoidForward(const T* x, int64_t n, T* y) {
  ThreadPool::Default().ParallelFor(n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = Sigmoid(x[i]);
  });
}

template <typename X, typename Y>
void AddScaled(const X* x, float alpha, int64_t n, Y* y) {
  using A = decltype(Load(Y{}));
  const A a = static_cast<A>(alpha);
  ThreadPool::Default().ParallelFor(n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] += a * static_cast<A>(Load(x[i]));
  });
}

template <typename X, typename Y>
void Convert(const X* x, int64_t n, Y* y) {
  ThreadPool::Default().ParallelFor(n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = Store<Y>(Load(x[i]));
  });
}

template <typename T>
void AddRowBiasForward(const T* b, int64_t rows, int64_t cols, T* y) {
  ThreadPool::Default().ParallelFor(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1)),
                                    [&](int64_t begin, int64_t end) {
                                      for (int64_t r = begin; r < end; ++r) {
                                        for (int64_t c = 0; c < cols; ++c) y[r * cols + c] += b[c];
                                      }
                                    });
}

template <typename T>
void RowBiasBackward(const T* dy, int64_t rows, int64_t cols, T* db) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) db[c] += dy[r * cols + c];
  }
}

#define ORRERY_INSTANTIATE(T)                                                          \
  template void AddRowBiasForward<T>(const T*, int64_t, int64_t, T*);                  \
  template void RowBiasBackward<T>(const T*, int64_t, int64_t, T*);                    \
  template void SigmoidGateForward<T>(const T*, const T*, int64_t, T*);                \
  template void SigmoidGateBackward<T>(const T*, const T*, const T*, int64_t, T*, T*); \
  template void SigmoidForward<T>(const T*, int64_t, T*);                              \
  template void AddScaled<T, T>(const T*, float, int64_t, T*);
ORRERY_INSTANTIATE(float)
ORRERY_INSTANTIATE(double)
#undef ORRERY_INSTANTIATE
template void AddScaled<BFloat16, float>(const BFloat16*, float, int64_t, float*);
template void Convert<float, float>(const float*, int64_t, float*);
template void Convert<float, BFloat16>(const float*, int64_t, BFloat16*);
template void Convert<BFloat16, float>(const BFloat16*, int64_t, float*);
template void Convert<BFloat16, BFloat16>(const BFloat16*, int64_t, BFloat16*);

}  // namespace orrery::kernels
