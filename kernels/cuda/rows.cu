// Row copies by index and column-block copies (kernels/rows.h): one warp per row moving 16-, 4-
// or 1-byte words (the widest that the row size and both base addresses allow), grid-stride over
// rows; columns through cudaMemcpy2DAsync.
#include <cstdint>

#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/rows_cuda.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;

template <typename W>
__global__ void CopyRowsKernel(const W* __restrict__ src, const int32_t* __restrict__ index,
                               int64_t n, int64_t words, int64_t rows_src, int64_t rows_dst,
                               bool scatter, W* __restrict__ dst) {
  const int lane = threadIdx.x % 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < n;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t id = index[r];
    if (id < 0 || id >= (scatter ? rows_dst : rows_src)) continue;
    const W* s = src + (scatter ? r : id) * words;
    W* d = dst + (scatter ? id : r) * words;
    for (int64_t i = lane; i < words; i += 32) d[i] = s[i];
  }
}

template <typename W>
Status Launch(const Tensor& src, const Tensor& index, int64_t row_bytes, int64_t rows_src,
              int64_t rows_dst, bool scatter, Tensor* dst, cudaStream_t stream) {
  const int64_t n = index.numel();
  CopyRowsKernel<W><<<GridFor(n, kWarps), kThreads, 0, stream>>>(
      static_cast<const W*>(src.raw_data()), index.data<int32_t>(), n,
      row_bytes / static_cast<int64_t>(sizeof(W)), rows_src, rows_dst, scatter,
      static_cast<W*>(dst->raw_data()));
  return LastLaunchStatus("CopyRowsKernel");
}

bool Aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

}  // namespace

Status CopyRowsCuda(const Tensor& src, const Tensor& index, int64_t row_bytes, int64_t rows_src,
                    int64_t rows_dst, bool scatter, Tensor* dst) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(src.device().index));
  auto fits = [&](size_t w) {
    return row_bytes % static_cast<int64_t>(w) == 0 && Aligned(src.raw_data(), w) &&
           Aligned(dst->raw_data(), w);
  };
  if (fits(16))
    return Launch<uint4>(src, index, row_bytes, rows_src, rows_dst, scatter, dst, ctx->stream());
  if (fits(4))
    return Launch<uint32_t>(src, index, row_bytes, rows_src, rows_dst, scatter, dst, ctx->stream());
  return Launch<uint8_t>(src, index, row_bytes, rows_src, rows_dst, scatter, dst, ctx->stream());
}

Status CopyColumnsCuda(const Tensor& src, int64_t src_col, int64_t cols, Tensor* dst,
                       int64_t dst_col) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(src.device().index));
  const size_t es = DTypeSize(src.dtype());
  return CudaStatus(
      cudaMemcpy2DAsync(static_cast<char*>(dst->raw_data()) + dst_col * es, dst->dim(1) * es,
                        static_cast<const char*>(src.raw_data()) + src_col * es, src.dim(1) * es,
                        cols * es, src.dim(0), cudaMemcpyDeviceToDevice, ctx->stream()),
      "cudaMemcpy2DAsync");
}

}  // namespace orrery::kernels::cuda
