// RMSNorm forward and backward over rows (kernels/rmsnorm.h); sums in f32.
// Forward: one warp per row, grid-stride over rows.
// Backward: the rows go in rounds of kWarps x rows_per_warp; per round, pass 1 takes a warp per
// row for mean(xhat w dy) into shared memory, then pass 2 runs the block over the round by
// columns: the block's dw partial is [groups][d] slots (groups = kThreads / d for rows narrower
// than the block, else 1, so narrow rows keep every thread busy), each slot owned by one thread,
// which writes dx of its column for rows group, group + groups, ... of the round and adds their
// dy xhat to its slot in row order. At the end the block's groups are summed in order into its
// row of a [blocks, d] scratch, and LaunchColumnSums (column_sums.h) adds the rows into dw in an
// order fixed by the shape: no atomics, so the same inputs give the same bits on every run (the
// atomic version's last bits depended on the order of blocks). Reads and writes are those of
// the atomic version: x and dy twice (the second time mostly from L1/L2), dx once.
// The atomic version measured 0.403 / 0.828 ms at 32768 x 2048 / 16384 x 7168 bf16
// (docs/benchmarks.md); this one not yet timed.
#include <algorithm>

#include "kernels/cuda/column_sums.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr size_t kSharedBytes = 48 * 1024;  // the default limit of a block's shared memory
// The backward's rounds: about this many elements each (a round of 8 rows of 2048 has 16K).
constexpr int64_t kRoundElements = 4096;
constexpr int kMaxRowsPerWarp = 8;

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

// dx = rstd (w dy - xhat mean(xhat w dy)); dw's partial of this block += sum_rows dy xhat.
// dw_parts: [gridDim.x, d], or null (no dw). Shared memory: mean and rstd [2][round rows], then,
// when dw_shared, the block's [groups][d] slots (else groups == 1 and the slots are its dw_parts
// row).
template <typename T>
__global__ void RmsNormBackwardKernel(const T* __restrict__ x, const T* __restrict__ w,
                                      const float* __restrict__ rstd, const T* __restrict__ dy,
                                      int64_t rows, int64_t d, int rows_per_warp, int groups,
                                      T* __restrict__ dx, float* __restrict__ dw_parts,
                                      bool dw_shared) {
  extern __shared__ float smem[];
  const int round_rows = kWarps * rows_per_warp;
  float* mean = smem;
  float* rs_round = smem + round_rows;
  float* slot = dw_parts == nullptr ? nullptr
                : dw_shared         ? smem + 2 * round_rows
                                    : dw_parts + static_cast<int64_t>(blockIdx.x) * d;
  const int64_t slots = groups * d;
  if (slot != nullptr) {
    for (int64_t i = threadIdx.x; i < slots; i += kThreads) slot[i] = 0.0f;
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * round_rows; base < rows;
       base += static_cast<int64_t>(gridDim.x) * round_rows) {
    // Pass 1: a warp per row.
    for (int j = 0; j < rows_per_warp; ++j) {
      const int li = warp * rows_per_warp + j;
      const int64_t r = base + li;
      float dot = 0.0f;
      if (r < rows) {
        const T* xr = x + r * d;
        const T* dyr = dy + r * d;
        const float rs = rstd[r];
        for (int64_t i = lane; i < d; i += 32) {
          const float g = w != nullptr ? ToF(w[i]) : 1.0f;
          dot += ToF(xr[i]) * rs * g * ToF(dyr[i]);
        }
      }
      dot = WarpSum(dot);
      if (lane == 0) {
        mean[li] = dot / static_cast<float>(d);
        rs_round[li] = r < rows ? rstd[r] : 0.0f;
      }
    }
    __syncthreads();
    // Pass 2: the block by (group, column) slots.
    for (int64_t i = threadIdx.x; i < slots; i += kThreads) {
      const int group = static_cast<int>(i / d);
      const int64_t c = i % d;
      const float g = w != nullptr ? ToF(w[c]) : 1.0f;
      float acc = 0.0f;
#pragma unroll 4
      for (int li = group; li < round_rows && base + li < rows; li += groups) {
        const int64_t r = base + li;
        const float rs = rs_round[li];
        const float xhat = ToF(x[r * d + c]) * rs;
        const float gy = ToF(dy[r * d + c]);
        dx[r * d + c] = FromF<T>(rs * (g * gy - xhat * mean[li]));
        acc += gy * xhat;
      }
      if (slot != nullptr) slot[i] += acc;
    }
    __syncthreads();  // mean is rewritten by the next round
  }
  if (dw_parts != nullptr && dw_shared) {
    for (int64_t c = threadIdx.x; c < d; c += kThreads) {
      float s = slot[c];
      for (int group = 1; group < groups; ++group) s += slot[group * d + c];
      dw_parts[static_cast<int64_t>(blockIdx.x) * d + c] = s;
    }
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
  const int rows_per_warp = static_cast<int>(
      std::clamp<int64_t>((kRoundElements + kWarps * d - 1) / (kWarps * d), 1, kMaxRowsPerWarp));
  const int round_rows = kWarps * rows_per_warp;
  const int groups = d >= kThreads ? 1 : static_cast<int>(kThreads / d);
  const unsigned grid = GridFor(rows, round_rows);
  Tensor parts;
  if (dw->defined()) {
    ORRERY_ASSIGN_OR_RETURN(parts, Tensor::Allocate({grid, d}, DType::kF32, x.device()));
  }
  const size_t mean_bytes = sizeof(float) * 2 * round_rows;
  const size_t slot_bytes = sizeof(float) * static_cast<size_t>(groups * d);
  // Rows too wide for the slots in shared memory (d > ~12K) take their block's row of the
  // scratch as the slots (groups is 1 there).
  const bool shared = parts.defined() && mean_bytes + slot_bytes <= kSharedBytes;
  RmsNormBackwardKernel<T><<<grid, kThreads, mean_bytes + (shared ? slot_bytes : 0), s>>>(
      Data<T>(x), Data<T>(w), rstd.data<float>(), Data<T>(dy), rows, d, rows_per_warp, groups,
      static_cast<T*>(dx->raw_data()), parts.defined() ? parts.data<float>() : nullptr, shared);
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("RmsNormBackwardKernel"));
  if (!parts.defined()) return Status::OK();
  return LaunchColumnSums(parts.data<float>(), grid, d, true, dw->data<float>(), s);
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
