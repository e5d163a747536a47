// The fixed-order column sums of partials (column_sums.h; the order: column_sums_order.h): one
// block of kColumnSumThreads per tile of columns, each thread summing a strided set of rows of one
// column, then one thread per column adding the lanes' sums in lane order.
// Not yet timed: at the sizes the ops give (a few hundred to a thousand rows of at most a few
// thousand columns) it reads well under a megabyte, against the tens of megabytes of the kernels
// that write the partials.
#include "kernels/cuda/column_sums.h"
#include "kernels/cuda/column_sums_order.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace {

template <typename T>
__global__ void __launch_bounds__(kColumnSumThreads)
    ColumnSumsKernel(const T* __restrict__ parts, int64_t rows, int64_t cols, bool accumulate,
                     T* __restrict__ out) {
  __shared__ T lane_sums[kColumnSumThreads];  // [lane][column of the tile]
  const int tile = ColumnSumTile(cols), lanes = kColumnSumThreads / tile;
  const int cl = static_cast<int>(threadIdx.x) % tile, lane = static_cast<int>(threadIdx.x) / tile;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * tile + cl;
  T s = 0;
  if (c < cols) {
    for (int64_t r = lane; r < rows; r += lanes) s += parts[r * cols + c];
  }
  lane_sums[threadIdx.x] = s;
  __syncthreads();
  if (lane == 0 && c < cols) {
    T total = lane_sums[cl];
    for (int l = 1; l < lanes; ++l) total += lane_sums[l * tile + cl];
    out[c] = accumulate ? out[c] + total : total;
  }
}

}  // namespace

template <typename T>
Status LaunchColumnSums(const T* parts, int64_t rows, int64_t cols, bool accumulate, T* out,
                        cudaStream_t stream) {
  if (cols <= 0) return Status::OK();
  const int64_t tile = ColumnSumTile(cols);
  ColumnSumsKernel<T>
      <<<static_cast<unsigned>((cols + tile - 1) / tile), kColumnSumThreads, 0, stream>>>(
          parts, rows, cols, accumulate, out);
  return LastLaunchStatus("ColumnSumsKernel");
}

template Status LaunchColumnSums<float>(const float*, int64_t, int64_t, bool, float*, cudaStream_t);
template Status LaunchColumnSums<double>(const double*, int64_t, int64_t, bool, double*,
                                         cudaStream_t);

Status ColumnSumsCuda(const Tensor& parts, bool accumulate, Tensor* out) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(parts.device().index));
  const int64_t rows = parts.dim(0), cols = parts.dim(1);
  if (parts.dtype() == DType::kF64) {
    return LaunchColumnSums(parts.data<double>(), rows, cols, accumulate, out->data<double>(),
                            ctx->stream());
  }
  return LaunchColumnSums(parts.data<float>(), rows, cols, accumulate, out->data<float>(),
                          ctx->stream());
}

}  // namespace orrery::kernels::cuda
