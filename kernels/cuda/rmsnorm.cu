// RMSNorm forward and backward over rows (kernels/rmsnorm.h): one warp per row, grid-stride over
// rows; sums in f32. The backward's dw is summed per block in shared memory, then added to the
// global f32 dw once per block (float atomics: the last bits depend on the order of blocks).
// Not yet timed: correct first (issue 22); its benchmark comes with the GPU model's profile.
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
// The largest d whose dw partial fits the default 48 KB of shared memory.
constexpr int64_t kMaxSharedD = 12288;

template <typename T>
__global__ void RmsNormForwardKernel(const T* __restrict__ x, const T* __restrict__ w, int64_t rows,
                                     int64_t d, float eps, T* __restrict__ y,
                                     float* __restrict__ rstd) {
  const int lane = threadIdx.x % 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const T* xr = x + r * d;
    float ss = 0.0f;
    for (int64_t i = lane; i < d; i += 32) {
      const float v = ToF(xr[i]);
      ss += v * v;
    }
    const float rs = rsqrtf(WarpSum(ss) / static_cast<float>(d) + eps);
    if (lane == 0) rstd[r] = rs;
    T* yr = y + r * d;
    for (int64_t i = lane; i < d; i += 32) {
      const float g = w != nullptr ? ToF(w[i]) : 1.0f;
      yr[i] = FromF<T>(ToF(xr[i]) * rs * g);
    }
  }
}

// dx = rstd (w dy - xhat mean(xhat w dy)); dw += sum_rows dy xhat.
template <typename T>
__global__ void RmsNormBackwardKernel(const T* __restrict__ x, const T* __restrict__ w,
                                      const float* __restrict__ rstd, const T* __restrict__ dy,
                                      int64_t rows, int64_t d, T* __restrict__ dx,
                                      float* __restrict__ dw, bool dw_shared) {
  extern __shared__ float dw_part[];
  if (dw != nullptr && dw_shared) {
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) dw_part[i] = 0.0f;
    __syncthreads();
  }
  const int lane = threadIdx.x % 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const T* xr = x + r * d;
    const T* dyr = dy + r * d;
    const float rs = rstd[r];
    float dot = 0.0f;
    for (int64_t i = lane; i < d; i += 32) {
      const float g = w != nullptr ? ToF(w[i]) : 1.0f;
      dot += ToF(xr[i]) * rs * g * ToF(dyr[i]);
    }
    const float mean = WarpSum(dot) / static_cast<float>(d);
    T* dxr = dx + r * d;
    for (int64_t i = lane; i < d; i += 32) {
      const float g = w != nullptr ? ToF(w[i]) : 1.0f;
      const float xhat = ToF(xr[i]) * rs;
      const float gy = ToF(dyr[i]);
      dxr[i] = FromF<T>(rs * (g * gy - xhat * mean));
      if (dw != nullptr) {
        if (dw_shared) {
          atomicAdd(&dw_part[i], gy * xhat);
        } else {
          atomicAdd(&dw[i], gy * xhat);
        }
      }
    }
  }
  if (dw != nullptr && dw_shared) {
    __syncthreads();
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) atomicAdd(&dw[i], dw_part[i]);
  }
}

template <typename T>
const T* Data(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.raw_data()) : nullptr;
}

template <typename T>
Status Forward(const Tensor& x, const Tensor& w, double eps, Tensor* y, Tensor* rstd,
               cudaStream_t s) {
  const int64_t rows = x.dim(0), d = x.dim(1);
  RmsNormForwardKernel<T><<<GridFor(rows, kWarps), kThreads, 0, s>>>(
      Data<T>(x), Data<T>(w), rows, d, static_cast<float>(eps), static_cast<T*>(y->raw_data()),
      rstd->data<float>());
  return LastLaunchStatus("RmsNormForwardKernel");
}

template <typename T>
Status Backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor* dx,
                Tensor* dw, cudaStream_t s) {
  const int64_t rows = x.dim(0), d = x.dim(1);
  float* dwp = dw->defined() ? dw->data<float>() : nullptr;
  const bool shared = dwp != nullptr && d <= kMaxSharedD;
  const size_t smem = shared ? static_cast<size_t>(d) * sizeof(float) : 0;
  RmsNormBackwardKernel<T><<<GridFor(rows, kWarps), kThreads, smem, s>>>(
      Data<T>(x), Data<T>(w), rstd.data<float>(), Data<T>(dy), rows, d,
      static_cast<T*>(dx->raw_data()), dwp, shared);
  return LastLaunchStatus("RmsNormBackwardKernel");
}

}  // namespace

Status RmsNormForwardCuda(const Tensor& x, const Tensor& w, double eps, Tensor* y, Tensor* rstd) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(x.device().index));
  if (x.dtype() == DType::kBF16) return Forward<__nv_bfloat16>(x, w, eps, y, rstd, ctx->stream());
  return Forward<float>(x, w, eps, y, rstd, ctx->stream());
}

Status RmsNormBackwardCuda(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                           Tensor* dx, Tensor* dw) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(x.device().index));
  if (x.dtype() == DType::kBF16) {
    return Backward<__nv_bfloat16>(x, w, rstd, dy, dx, dw, ctx->stream());
  }
  return Backward<float>(x, w, rstd, dy, dx, dw, ctx->stream());
}

}  // namespace orrery::kernels::cuda
