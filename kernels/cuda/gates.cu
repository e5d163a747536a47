// The element-wise ops of kernels/gates.h (sigmoid gate forward and backward, sigmoid, y += alpha
// x, casts): grid-stride loops in f32 arithmetic on bf16 or f32 storage, precise expf, bf16
// results rounded to nearest even (__float2bfloat16, as the CPU's FloatToBFloat16). One kernel
// template per op, launched for the storage types the dispatcher admits (kernels/gates_op.cc).
// Not yet timed: memory-bound one-pass loops; the gates fuse into neighbouring kernels later.
#include <algorithm>

#include "kernels/cuda/column_sums.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename T>
__global__ void SigmoidGateForwardKernel(const T* __restrict__ x, const T* __restrict__ z,
                                         int64_t n, T* __restrict__ y) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = FromF<T>(ToF(x[i]) * Sigmoid(ToF(z[i])));
  }
}

template <typename T>
__global__ void SigmoidGateBackwardKernel(const T* __restrict__ x, const T* __restrict__ z,
                                          const T* __restrict__ dy, int64_t n, T* __restrict__ dx,
                                          T* __restrict__ dz) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float s = Sigmoid(ToF(z[i])), g = ToF(dy[i]);
    dx[i] = FromF<T>(g * s);
    dz[i] = FromF<T>(g * ToF(x[i]) * s * (1.0f - s));
  }
}

template <typename X, typename Y>
__global__ void SigmoidKernel(const X* __restrict__ x, int64_t n, Y* __restrict__ y) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = FromF<Y>(Sigmoid(ToF(x[i])));
  }
}

template <typename X, typename Y>
__global__ void AddIntoKernel(const X* __restrict__ x, float alpha, int64_t n, Y* __restrict__ y) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = FromF<Y>(ToF(y[i]) + alpha * ToF(x[i]));
  }
}

template <typename X, typename Y>
__global__ void CastKernel(const X* __restrict__ x, int64_t n, Y* __restrict__ y) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = FromF<Y>(ToF(x[i]));
  }
}

template <typename T>
__global__ void AddRowBiasKernel(const T* __restrict__ b, int64_t n, int64_t cols,
                                 T* __restrict__ y) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = FromF<T>(ToF(y[i]) + ToF(b[i % cols]));
  }
}

// Column sums: a block of 32 x 8 threads owns 32 adjacent columns (coalesced rows of dy) and a
// stride of rows; the 8 partial sums meet in shared memory, summed in order into the block's row
// of a [row blocks, cols] scratch, and LaunchColumnSums (column_sums.h) adds the rows into db in an
// order fixed by the shape: no float atomics, the same bits on every run.
constexpr int kBiasCols = 32, kBiasRows = 8;

template <typename T>
__global__ void RowBiasGradKernel(const T* __restrict__ dy, int64_t rows, int64_t cols,
                                  float* __restrict__ db_parts) {
  __shared__ float part[kBiasRows][kBiasCols];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kBiasCols + threadIdx.x;
  float sum = 0.0f;
  if (col < cols) {
    for (int64_t r = static_cast<int64_t>(blockIdx.y) * kBiasRows + threadIdx.y; r < rows;
         r += static_cast<int64_t>(gridDim.y) * kBiasRows) {
      sum += ToF(dy[r * cols + col]);
    }
  }
  part[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    for (int i = 1; i < kBiasRows; ++i) sum += part[i][threadIdx.x];
    db_parts[static_cast<int64_t>(blockIdx.y) * cols + col] = sum;
  }
}

using bf16 = __nv_bfloat16;

template <typename T>
const T* In(const Tensor& t) {
  return static_cast<const T*>(t.raw_data());
}
template <typename T>
T* Out(Tensor* t) {
  return static_cast<T*>(t->raw_data());
}

template <typename X, typename Y>
Status LaunchSigmoid(const Tensor& x, Tensor* y, cudaStream_t s) {
  SigmoidKernel<X, Y>
      <<<GridFor(x.numel(), kThreads), kThreads, 0, s>>>(In<X>(x), x.numel(), Out<Y>(y));
  return LastLaunchStatus("SigmoidKernel");
}

template <typename X, typename Y>
Status LaunchAddInto(const Tensor& x, float alpha, Tensor* y, cudaStream_t s) {
  AddIntoKernel<X, Y>
      <<<GridFor(x.numel(), kThreads), kThreads, 0, s>>>(In<X>(x), alpha, x.numel(), Out<Y>(y));
  return LastLaunchStatus("AddIntoKernel");
}

template <typename X, typename Y>
Status LaunchCast(const Tensor& x, Tensor* y, cudaStream_t s) {
  CastKernel<X, Y>
      <<<GridFor(x.numel(), kThreads), kThreads, 0, s>>>(In<X>(x), x.numel(), Out<Y>(y));
  return LastLaunchStatus("CastKernel");
}

}  // namespace

Status SigmoidGateForwardCuda(const Tensor& x, const Tensor& z, Tensor* y) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(x.device().index));
  const int64_t n = x.numel();
  const unsigned grid = GridFor(n, kThreads);
  if (x.dtype() == DType::kBF16) {
    SigmoidGateForwardKernel<bf16>
        <<<grid, kThreads, 0, ctx->stream()>>>(In<bf16>(x), In<bf16>(z), n, Out<bf16>(y));
  } else {
    SigmoidGateForwardKernel<float>
        <<<grid, kThreads, 0, ctx->stream()>>>(In<float>(x), In<float>(z), n, Out<float>(y));
  }
  return LastLaunchStatus("SigmoidGateForwardKernel");
}

Status SigmoidGateBackwardCuda(const Tensor& x, const Tensor& z, const Tensor& dy, Tensor* dx,
                               Tensor* dz) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(x.device().index));
  const int64_t n = x.numel();
  const unsigned grid = GridFor(n, kThreads);
  if (x.dtype() == DType::kBF16) {
    SigmoidGateBackwardKernel<bf16><<<grid, kThreads, 0, ctx->stream()>>>(
        In<bf16>(x), In<bf16>(z), In<bf16>(dy), n, Out<bf16>(dx), Out<bf16>(dz));
  } else {
    SigmoidGateBackwardKernel<float><<<grid, kThreads, 0, ctx->stream()>>>(
        In<float>(x), In<float>(z), In<float>(dy), n, Out<float>(dx), Out<float>(dz));
  }
  return LastLaunchStatus("SigmoidGateBackwardKernel");
}

Status SigmoidCuda(const Tensor& x, Tensor* y) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(x.device().index));
  cudaStream_t s = ctx->stream();
  if (x.dtype() == DType::kF32) return LaunchSigmoid<float, float>(x, y, s);
  if (y->dtype() == DType::kF32) return LaunchSigmoid<bf16, float>(x, y, s);
  return LaunchSigmoid<bf16, bf16>(x, y, s);
}

Status AddIntoCuda(const Tensor& x, float alpha, Tensor* y) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(x.device().index));
  cudaStream_t s = ctx->stream();
  if (x.dtype() == DType::kF32) return LaunchAddInto<float, float>(x, alpha, y, s);
  if (y->dtype() == DType::kF32) return LaunchAddInto<bf16, float>(x, alpha, y, s);
  return LaunchAddInto<bf16, bf16>(x, alpha, y, s);
}

Status CastIntoCuda(const Tensor& x, Tensor* y) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(x.device().index));
  cudaStream_t s = ctx->stream();
  const bool to_f32 = y->dtype() == DType::kF32;
  if (x.dtype() == DType::kF32) {
    return to_f32 ? LaunchCast<float, float>(x, y, s) : LaunchCast<float, bf16>(x, y, s);
  }
  return to_f32 ? LaunchCast<bf16, float>(x, y, s) : LaunchCast<bf16, bf16>(x, y, s);
}

Status AddRowBiasCuda(const Tensor& b, Tensor* y) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(y->device().index));
  const int64_t n = y->numel(), cols = y->dim(1);
  const unsigned grid = GridFor(n, kThreads);
  if (y->dtype() == DType::kBF16) {
    AddRowBiasKernel<bf16>
        <<<grid, kThreads, 0, ctx->stream()>>>(In<bf16>(b), n, cols, Out<bf16>(y));
  } else {
    AddRowBiasKernel<float>
        <<<grid, kThreads, 0, ctx->stream()>>>(In<float>(b), n, cols, Out<float>(y));
  }
  return LastLaunchStatus("AddRowBiasKernel");
}

Status RowBiasGradCuda(const Tensor& dy, Tensor* db) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(dy.device().index));
  const int64_t rows = dy.dim(0), cols = dy.dim(1);
  const dim3 block(kBiasCols, kBiasRows);
  const int64_t row_blocks =
      std::max<int64_t>(std::min<int64_t>((rows + kBiasRows - 1) / kBiasRows, 256), 1);
  const dim3 grid(static_cast<unsigned>((cols + kBiasCols - 1) / kBiasCols),
                  static_cast<unsigned>(row_blocks));
  ORRERY_ASSIGN_OR_RETURN(Tensor parts,
                          Tensor::Allocate({row_blocks, cols}, DType::kF32, dy.device()));
  if (dy.dtype() == DType::kBF16) {
    RowBiasGradKernel<bf16>
        <<<grid, block, 0, ctx->stream()>>>(In<bf16>(dy), rows, cols, parts.data<float>());
  } else {
    RowBiasGradKernel<float>
        <<<grid, block, 0, ctx->stream()>>>(In<float>(dy), rows, cols, parts.data<float>());
  }
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("RowBiasGradKernel"));
  return LaunchColumnSums(parts.data<float>(), row_blocks, cols, true, Out<float>(db),
                          ctx->stream());
}

}  // namespace orrery::kernels::cuda
