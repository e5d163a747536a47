#include "kernels/short_conv.h"

#include <algorithm>

#include "core/thread_pool.h"
#include "kernels/cpu/fast_math.h"

namespace orrery::kernels {
namespace {

using cpu::Sigmoid;

// The [start, end) of the document holding token t: the last cu[k] <= t and the one after it.
struct Doc {
  int64_t start, end;
};
Doc DocOf(const std::vector<int64_t>& cu, int64_t t) {
  const auto next = std::upper_bound(cu.begin(), cu.end(), t);
  return {*(next - 1), *next};
}

// The conv sum at (t, c) over the taps inside the document starting at `start`.
template <typename T>
T Pre(const T* x, int64_t channels, const T* wc, int64_t width, int64_t start, int64_t t,
      int64_t c) {
  T acc = 0;
  for (int64_t j = 0; j < width; ++j) {
    const int64_t src = t - (width - 1) + j;
    if (src >= start) acc += wc[j] * x[src * channels + c];
  }
  return acc;
}

}  // namespace

template <typename T>
void ShortConvSiluForward(const T* x, int64_t channels, const T* w, int64_t width,
                          const std::vector<int64_t>& cu, T* y) {
  ThreadPool::Default().ParallelFor(cu.back(), 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t start = DocOf(cu, t).start;
      for (int64_t c = 0; c < channels; ++c) {
        const T a = Pre(x, channels, w + c * width, width, start, t, c);
        y[t * channels + c] = a * Sigmoid(a);
      }
    }
  });
}

template <typename T>
void ShortConvSiluBackward(const T* x, int64_t channels, const T* w, int64_t width,
                           const std::vector<int64_t>& cu, const T* dy, T* dx, T* dw) {
  const int64_t n = cu.back();
  // g = dL/dpre = dy * SiLU'(pre), pre recomputed.
  std::vector<T> g(static_cast<size_t>(n * channels));
  ThreadPool::Default().ParallelFor(n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t start = DocOf(cu, t).start;
      for (int64_t c = 0; c < channels; ++c) {
        const T a = Pre(x, channels, w + c * width, width, start, t, c), s = Sigmoid(a);
        g[t * channels + c] = dy[t * channels + c] * (s + a * s * (T(1) - s));
      }
    }
  });
  // dx[s] gathers the taps of the outputs t = s .. s + W - 1 of its document, t ascending.
  ThreadPool::Default().ParallelFor(n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      const int64_t last = std::min(s + width, DocOf(cu, s).end);
      for (int64_t c = 0; c < channels; ++c) {
        T acc = 0;
        for (int64_t t = s; t < last; ++t) {
          acc += g[t * channels + c] * w[c * width + (width - 1) - (t - s)];
        }
        dx[s * channels + c] = acc;
      }
    }
  });
  // dw[c, :] is a reduction over tokens: split by channel only, so each sum keeps token order.
  ThreadPool::Default().ParallelFor(channels, 4, [&](int64_t begin, int64_t end) {
    for (size_t d = 0; d + 1 < cu.size(); ++d) {
      for (int64_t t = cu[d]; t < cu[d + 1]; ++t) {
        for (int64_t c = begin; c < end; ++c) {
          const T gt = g[t * channels + c];
          for (int64_t j = 0; j < width; ++j) {
            const int64_t src = t - (width - 1) + j;
            if (src >= cu[d]) dw[c * width + j] += gt * x[src * channels + c];
          }
        }
      }
    }
  });
}

template <typename T>
void ShortConvSiluDecodeStep(const T* x, int64_t n, int64_t channels, const T* w, int64_t width,
                             const int32_t* rows, T* hist, T* y) {
  const int64_t h = width - 1;
  for (int64_t i = 0; i < n; ++i) {
    T* hr = rows[i] >= 0 && h > 0 ? hist + static_cast<int64_t>(rows[i]) * h * channels : nullptr;
    for (int64_t c = 0; c < channels; ++c) {
      const T* wc = w + c * width;
      T acc = 0;  // the window's taps in order: history (oldest first), then the new row
      for (int64_t j = 0; j < h; ++j) acc += wc[j] * (hr != nullptr ? hr[j * channels + c] : T(0));
      acc += wc[h] * x[i * channels + c];
      y[i * channels + c] = acc * Sigmoid(acc);
      if (hr == nullptr) continue;
      for (int64_t j = 0; j + 1 < h; ++j) hr[j * channels + c] = hr[(j + 1) * channels + c];
      hr[(h - 1) * channels + c] = x[i * channels + c];
    }
  }
}

#define ORRERY_INSTANTIATE(T)                                                             \
  template void ShortConvSiluForward<T>(const T*, int64_t, const T*, int64_t,             \
                                        const std::vector<int64_t>&, T*);                 \
  template void ShortConvSiluBackward<T>(const T*, int64_t, const T*, int64_t,            \
                                         const std::vector<int64_t>&, const T*, T*, T*);  \
  template void ShortConvSiluDecodeStep<T>(const T*, int64_t, int64_t, const T*, int64_t, \
                                           const int32_t*, T*, T*);
ORRERY_INSTANTIATE(float)
ORRERY_INSTANTIATE(double)
#undef ORRERY_INSTANTIATE

}  // namespace orrery::kernels
