// Shared pieces of the SIMT causal attention kernels (attention_forward.cu, attention_backward.cu):
// the tile shape, the document lookup, the f32 tile loads and the shared-memory opt-in.
//
// Every kernel pairs a tile of kTile = 32 "own" rows (query rows in the forward and the dq pass,
// key rows in the dk/dv pass), spread kRowsPerWarp to a warp, with a stream of 32-row tiles of the
// other operand, one row per lane: lane j computes the dot products of its row with the warp's
// own rows, and the warp then sums over its 32 lanes' rows into per-lane output columns
// (column c = lane + 32 e, e < kMaxPerLane).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"

namespace orrery::kernels::cuda::attention {

constexpr int kWarps = 8, kThreads = kWarps * 32, kRowsPerWarp = 4;
constexpr int kTile = kWarps * kRowsPerWarp;
static_assert(kTile == 32, "one lane per row of the streamed tile");
constexpr int kMaxDim = 256, kMaxPerLane = kMaxDim / 32;

// The row stride of a tile read one row per lane: odd, so that the 32 lanes reading the same
// column of 32 rows hit 32 different banks.
__host__ __device__ constexpr int Padded(int dim) { return dim | 1; }

__device__ __forceinline__ float WarpMax(float x) {
  for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

// The document holding token i: the last d < entries - 1 with cu[d] <= i (cu: `entries` offsets).
__device__ __forceinline__ int64_t DocOf(const int64_t* __restrict__ cu, int64_t entries,
                                         int64_t i) {
  int64_t lo = 0, hi = entries - 1;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (cu[mid] <= i) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Rows row0 .. row0 + kTile - 1 of head h of x [n, heads, dim] as f32 into dst[r * ld + c]; rows
// outside [0, n) read as zeros. Called by all kThreads threads of the block.
template <typename T>
__device__ __forceinline__ void LoadTile(const T* __restrict__ x, int64_t row0, int64_t n,
                                         int heads, int h, int dim, float* dst, int ld) {
  for (int idx = threadIdx.x; idx < kTile * dim; idx += kThreads) {
    const int r = idx / dim, c = idx - r * dim;
    const int64_t row = row0 + r;
    dst[r * ld + c] =
        row >= 0 && row < n ? ToF(x[(row * heads + h) * static_cast<int64_t>(dim) + c]) : 0.0f;
  }
}

// Lets `kernel` take `bytes` of dynamic shared memory (past the default 48 KB).
template <typename Kernel>
Status AllowSharedBytes(Kernel kernel, size_t bytes, const char* what) {
  return CudaStatus(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes)),
                    what);
}

}  // namespace orrery::kernels::cuda::attention
