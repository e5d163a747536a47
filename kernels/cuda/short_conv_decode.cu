// The short conv + SiLU of one new token per sequence against each sequence's history row
// (kernels/short_conv.h, ShortConvSiluDecode): the inference engine's decode step.
//
// One thread per (sequence, channel), consecutive threads on consecutive channels (coalesced rows
// of x, y and of each history row). A thread reads its W - 1 history values and the new one, sums
// the taps in the forward kernel's order (short_conv.cu: oldest first, f32, precise expf in the
// sigmoid), writes y and shifts its column of the history row by one, the new value last. No two
// threads touch the same history element (a padding row, rows[n] < 0, has a zero history and
// writes none). Widths 2, 3 and 4 (K3's) are compile-time constants. Not yet timed (a few
// microseconds: N x C x W elements).
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxWidth = 16;  // the dispatcher's limit (kernels/short_conv_op.cc)

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename T, int kW>
__global__ void ShortConvSiluDecodeKernel(const T* __restrict__ x, const T* __restrict__ w,
                                          const int32_t* __restrict__ rows, int64_t n,
                                          int64_t channels, int runtime_width, T* hist,
                                          T* __restrict__ y) {
  constexpr int MW = kW > 0 ? kW : kMaxWidth;
  const int width = kW > 0 ? kW : runtime_width, h = width - 1;
  const int64_t total = n * channels;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / channels, c = i % channels;
    const int32_t row = rows[t];
    T* hr = h > 0 && row >= 0 ? hist + static_cast<int64_t>(row) * h * channels + c : nullptr;
    float window[MW];
#pragma unroll
    for (int j = 0; j < MW; ++j) {
      window[j] = 0.0f;  // a padding row's history
      if (j < h && hr != nullptr) window[j] = ToF(hr[static_cast<int64_t>(j) * channels]);
    }
    const T xn = x[i];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < MW; ++j) {
      if (j < h) acc += ToF(w[c * width + j]) * window[j];
    }
    acc += ToF(w[c * width + h]) * ToF(xn);
    y[i] = FromF<T>(acc * Sigmoid(acc));
    if (hr == nullptr) continue;
#pragma unroll
    for (int j = 0; j + 1 < MW; ++j) {
      if (j + 1 < h) hr[static_cast<int64_t>(j) * channels] = FromF<T>(window[j + 1]);
    }
    hr[static_cast<int64_t>(h - 1) * channels] = xn;
  }
}

template <typename T>
Status Launch(const Tensor& x, const Tensor& w, const Tensor& rows, Tensor* hist, Tensor* y,
              cudaStream_t s) {
  const int64_t n = x.dim(0), channels = x.dim(1);
  const int width = static_cast<int>(w.dim(1));
  auto kernel = width == 4   ? ShortConvSiluDecodeKernel<T, 4>
                : width == 3 ? ShortConvSiluDecodeKernel<T, 3>
                : width == 2 ? ShortConvSiluDecodeKernel<T, 2>
                             : ShortConvSiluDecodeKernel<T, 0>;
  kernel<<<GridFor(n * channels, kThreads), kThreads, 0, s>>>(
      static_cast<const T*>(x.raw_data()), static_cast<const T*>(w.raw_data()),
      rows.data<int32_t>(), n, channels, width,
      width > 1 ? static_cast<T*>(hist->raw_data()) : nullptr, static_cast<T*>(y->raw_data()));
  return LastLaunchStatus("ShortConvSiluDecodeKernel");
}

}  // namespace

Status ShortConvSiluDecodeCuda(const Tensor& x, const Tensor& w, const Tensor& rows, Tensor* hist,
                               Tensor* y) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(x.device().index));
  if (x.dtype() == DType::kBF16) {
    return Launch<__nv_bfloat16>(x, w, rows, hist, y, ctx->stream());
  }
  return Launch<float>(x, w, rows, hist, y, ctx->stream());
}

}  // namespace orrery::kernels::cuda
