// The fixed summation order of the GPU ops' cross-block reductions (column_sums.cu), as plain code
// that host code runs too: tests/unit/kernels/column_sums_order_test.cc checks it on the CPU, and
// tests/gpu/determinism_gpu_test.cc requires the kernel's result to equal ColumnSumsInOrder's bit
// for bit.
//
// The reduction: out[c] (+)= sum over r < rows of parts[r * cols + c]. Every op that used to add a
// per-block partial into one output with a float atomic (whose order, and so whose last bits,
// depended on which block finished first) now writes its partials to a [rows, cols] buffer, one
// row per block, and this reduction adds them in an order fixed by (rows, cols) alone:
//   - the columns are cut into tiles of ColumnSumTile(cols) (32, or the power of two >= cols);
//   - a block of kColumnSumThreads threads takes one tile; its lanes = kColumnSumThreads / tile
//     row lanes, and lane l of column c sums rows l, l + lanes, l + 2 lanes, ... in ascending
//     order, starting from zero;
//   - the lanes' sums are then added in lane order (lane 0 first), and the total is added to out
//     (accumulate) or stored.
// No FMA can form (there are only additions), so the same order gives the same bits on the device
// and in ColumnSumsInOrder.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ORRERY_SUM_ORDER __host__ __device__ __forceinline__ constexpr
#else
#define ORRERY_SUM_ORDER inline constexpr
#endif

namespace orrery::kernels::cuda {

inline constexpr int kColumnSumThreads = 512;

// Columns per block: 32 (a warp's coalesced row piece), or the smallest power of two that holds
// them all when there are fewer, so narrow reductions (a loss's 1 or 7 sums) still get many lanes.
ORRERY_SUM_ORDER int ColumnSumTile(int64_t cols) {
  int tile = 1;
  while (tile < 32 && tile < cols) tile *= 2;
  return tile;
}

ORRERY_SUM_ORDER int ColumnSumLanes(int64_t cols) {
  return kColumnSumThreads / ColumnSumTile(cols);
}

// The host twin: the same additions in the same order.
template <typename T>
void ColumnSumsInOrder(const T* parts, int64_t rows, int64_t cols, bool accumulate, T* out) {
  const int lanes = ColumnSumLanes(cols);
  for (int64_t c = 0; c < cols; ++c) {
    T total = 0;
    for (int l = 0; l < lanes; ++l) {
      T lane_sum = 0;
      for (int64_t r = l; r < rows; r += lanes) lane_sum += parts[r * cols + c];
      total = l == 0 ? lane_sum : total + lane_sum;
    }
    out[c] = accumulate ? out[c] + total : total;
  }
}

}  // namespace orrery::kernels::cuda
