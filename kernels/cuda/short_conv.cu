// The KDA layer's causal depthwise short conv + SiLU within documents (kernels/short_conv.h), on
// bf16 or f32 storage in f32 arithmetic with the CPU twin's formulas (precise expf).
//
// Forward: one thread per (token, channel), grid-stride; consecutive threads take consecutive
// channels of a token (coalesced). Each finds its document by a binary search over cu (a few
// entries, cached), then sums its W taps.
// Backward: 32 channels x 8 tokens per block, grid-stride over tokens. A thread loads the 2W - 1
// inputs around its token once, recomputes the pre-activations of the W outputs its input feeds,
// and gathers dx from them (no atomics); dw is summed per thread in registers, then per block in
// shared memory (the 8 token rows in order), then written to the block's row of a
// [token groups, C x W] scratch, and LaunchColumnSums (column_sums.h) adds the rows into dw in an
// order fixed by the shape: no float atomics, so the same inputs give the same bits on every run
// (the atomic version's last bits depended on the order of blocks). Register arrays are sized by
// kMaxWidth with every loop over taps unrolled to it, so the indices are compile-time constants (no
// local memory). Widths 2, 3 and 4 (K3's) are compiled as constants: with the runtime width under
// kMaxWidth = 16 the loops ran 16 x 16 predicated taps per token, and the backward took 2.4 ms per
// call at 32768 x 1024 bf16 on the H200 (86.7 ms of one `small` step of 8 x 4K in the phase
// profile).
#include <algorithm>

#include "kernels/cuda/column_sums.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxWidth = 16;  // the dispatcher's limit (kernels/short_conv_op.cc)
constexpr int kTileC = 32, kTileT = 8;

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// The start and end of the document holding token t: cu[lo] <= t < cu[lo + 1], found by keeping
// cu[lo] <= t < cu[hi] (true at lo = 0, hi = docs since cu[0] = 0 and cu[docs] = N > t).
struct Doc {
  int64_t start, end;
};
__device__ __forceinline__ Doc DocOf(const int64_t* __restrict__ cu, int64_t docs, int64_t t) {
  int64_t lo = 0, hi = docs;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (cu[mid] <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return {cu[lo], cu[lo + 1]};
}

// kW > 0: the width as a compile-time constant (the loops over taps unroll to exactly kW);
// kW = 0: any width up to kMaxWidth, read from `width`.
template <typename T, int kW>
__global__ void ShortConvSiluForwardKernel(const T* __restrict__ x, const T* __restrict__ w,
                                           const int64_t* __restrict__ cu, int64_t docs, int64_t n,
                                           int64_t channels, int runtime_width, T* __restrict__ y) {
  const int width = kW > 0 ? kW : runtime_width;
  const int64_t total = n * channels;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / channels, c = i % channels;
    const int64_t start = DocOf(cu, docs, t).start;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < (kW > 0 ? kW : kMaxWidth); ++j) {
      const int64_t src = t - (width - 1) + j;
      if (j < width && src >= start) acc += ToF(w[c * width + j]) * ToF(x[src * channels + c]);
    }
    y[i] = FromF<T>(acc * Sigmoid(acc));
  }
}

// Thread (c, s): dx[s, c] = sum over taps j of g(t_j) w[c, j] with t_j = s + (W-1) - j inside the
// document, g(t) = dy[t] SiLU'(pre(t)); and dw[c, :] += g(s) x[s - (W-1) + :], summed into the
// block's row blockIdx.y of dw_parts [gridDim.y, C, W].
template <typename T, int kW>
__global__ void ShortConvSiluBackwardKernel(const T* __restrict__ x, const T* __restrict__ w,
                                            const int64_t* __restrict__ cu, int64_t docs, int64_t n,
                                            int64_t channels, int runtime_width,
                                            const T* __restrict__ dy, T* __restrict__ dx,
                                            float* __restrict__ dw_parts) {
  // MW: the register arrays' extent (the taps' loops unroll to it); width <= MW.
  constexpr int MW = kW > 0 ? kW : kMaxWidth;
  const int width = kW > 0 ? kW : runtime_width;
  __shared__ float part[kTileT][MW][kTileC];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kTileC + threadIdx.x;
  const bool active = c < channels;
  float wc[MW], dwc[MW];
#pragma unroll
  for (int j = 0; j < MW; ++j) {
    wc[j] = active && j < width ? ToF(w[c * width + j]) : 0.0f;
    dwc[j] = 0.0f;
  }
  for (int64_t s = static_cast<int64_t>(blockIdx.y) * kTileT + threadIdx.y; active && s < n;
       s += static_cast<int64_t>(gridDim.y) * kTileT) {
    const Doc doc = DocOf(cu, docs, s);
    // xw[m] = x[s - (MW-1) + m, c] inside the document and within W-1 of s, else 0 (a
    // zero stands for a tap that falls before the document's start).
    float xw[2 * MW - 1];
#pragma unroll
    for (int m = 0; m < 2 * MW - 1; ++m) {
      const int64_t row = s - (MW - 1) + m, off = m - (MW - 1);
      const bool in = off > -width && off < width && row >= doc.start && row < doc.end;
      xw[m] = in ? ToF(x[row * channels + c]) : 0.0f;
    }
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < MW; ++j) {
      const int64_t t = s + (width - 1) - j;  // the output that reads x[s] through tap j
      if (j < width && t < doc.end) {
        // pre(t) = sum_i w[c, i] x[t - (W-1) + i] = sum_i w[c, i] x[s - j + i].
        float a = 0.0f;
#pragma unroll
        for (int i = 0; i < MW; ++i) {
          if (i < width) a += wc[i] * xw[MW - 1 - j + i];
        }
        const float sg = Sigmoid(a);
        const float g = ToF(dy[t * channels + c]) * (sg + a * sg * (1.0f - sg));
        acc += g * wc[j];
        if (j == width - 1) {  // t == s: s's own output, whose taps are dw's terms
#pragma unroll
          for (int i = 0; i < MW; ++i) {
            if (i < width) dwc[i] += g * xw[MW - 1 - j + i];
          }
        }
      }
    }
    dx[s * channels + c] = FromF<T>(acc);
  }
#pragma unroll
  for (int j = 0; j < MW; ++j) part[threadIdx.y][j][threadIdx.x] = dwc[j];
  __syncthreads();
  if (!active) return;
  for (int j = threadIdx.y; j < width; j += kTileT) {
    float sum = 0.0f;
#pragma unroll
    for (int r = 0; r < kTileT; ++r) sum += part[r][j][threadIdx.x];
    dw_parts[static_cast<int64_t>(blockIdx.y) * channels * width + c * width + j] = sum;
  }
}

template <typename T>
const T* In(const Tensor& t) {
  return static_cast<const T*>(t.raw_data());
}
template <typename T>
T* Out(Tensor* t) {
  return static_cast<T*>(t->raw_data());
}

template <typename T>
Status Forward(const Tensor& x, const Tensor& w, const Tensor& cu, Tensor* y, cudaStream_t s) {
  const int64_t n = x.dim(0), channels = x.dim(1);
  const int width = static_cast<int>(w.dim(1));
  auto kernel = width == 4   ? ShortConvSiluForwardKernel<T, 4>
                : width == 3 ? ShortConvSiluForwardKernel<T, 3>
                : width == 2 ? ShortConvSiluForwardKernel<T, 2>
                             : ShortConvSiluForwardKernel<T, 0>;
  kernel<<<GridFor(n * channels, kThreads), kThreads, 0, s>>>(
      In<T>(x), In<T>(w), cu.data<int64_t>(), cu.dim(0) - 1, n, channels, width, Out<T>(y));
  return LastLaunchStatus("ShortConvSiluForwardKernel");
}

template <typename T>
Status Backward(const Tensor& x, const Tensor& w, const Tensor& cu, const Tensor& dy, Tensor* dx,
                Tensor* dw, cudaStream_t s) {
  const int64_t n = x.dim(0), channels = x.dim(1);
  const int64_t tiles = (channels + kTileC - 1) / kTileC;
  // About 8 blocks per SM of an H200 in all, at most one token group per 8 tokens.
  const int64_t groups =
      std::clamp<int64_t>(132 * 8 / tiles, 1, std::min<int64_t>((n + kTileT - 1) / kTileT, 65535));
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(groups));
  const int width = static_cast<int>(w.dim(1));
  ORRERY_ASSIGN_OR_RETURN(Tensor parts,
                          Tensor::Allocate({groups, channels * width}, DType::kF32, x.device()));
  auto kernel = width == 4   ? ShortConvSiluBackwardKernel<T, 4>
                : width == 3 ? ShortConvSiluBackwardKernel<T, 3>
                : width == 2 ? ShortConvSiluBackwardKernel<T, 2>
                             : ShortConvSiluBackwardKernel<T, 0>;
  kernel<<<grid, dim3(kTileC, kTileT), 0, s>>>(In<T>(x), In<T>(w), cu.data<int64_t>(),
                                               cu.dim(0) - 1, n, channels, width, In<T>(dy),
                                               Out<T>(dx), parts.data<float>());
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("ShortConvSiluBackwardKernel"));
  return LaunchColumnSums(parts.data<float>(), groups, channels * width, true, dw->data<float>(),
                          s);
}

}  // namespace

Status ShortConvSiluForwardCuda(const Tensor& x, const Tensor& w, const Tensor& cu_seqlens,
                                Tensor* y) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(x.device().index));
  if (x.dtype() == DType::kBF16) {
    return Forward<__nv_bfloat16>(x, w, cu_seqlens, y, ctx->stream());
  }
  return Forward<float>(x, w, cu_seqlens, y, ctx->stream());
}

Status ShortConvSiluBackwardCuda(const Tensor& x, const Tensor& w, const Tensor& cu_seqlens,
                                 const Tensor& dy, Tensor* dx, Tensor* dw) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(x.device().index));
  if (x.dtype() == DType::kBF16) {
    return Backward<__nv_bfloat16>(x, w, cu_seqlens, dy, dx, dw, ctx->stream());
  }
  return Backward<float>(x, w, cu_seqlens, dy, dx, dw, ctx->stream());
}

}  // namespace orrery::kernels::cuda
