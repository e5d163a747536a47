// PagedLatentWrite (kernels/mla_decode.h): one warp per latent row, grid-stride over rows, copying
// the row into its slot of the page pool; a negative slot or one outside the pool is skipped.
// A memory-bound copy of a few rows per decode step; not yet timed.
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;

template <typename T>
__global__ void PagedLatentWriteKernel(const T* __restrict__ latents,
                                       const int32_t* __restrict__ slots, int64_t rows, int64_t d,
                                       int64_t num_slots, T* __restrict__ pages) {
  const int lane = threadIdx.x % 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t slot = slots[r];
    if (slot < 0 || slot >= num_slots) continue;
    const T* src = latents + r * d;
    T* dst = pages + slot * d;
    for (int64_t i = lane; i < d; i += 32) dst[i] = src[i];
  }
}

}  // namespace

Status PagedLatentWriteCuda(const Tensor& latents, const Tensor& slot_mapping, Tensor* pages) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(latents.device().index));
  const int64_t rows = latents.dim(0), d = latents.dim(1);
  const int64_t num_slots = pages->dim(0) * pages->dim(1);
  const unsigned grid = GridFor(rows * 32, kThreads);
  const int32_t* slots = static_cast<const int32_t*>(slot_mapping.raw_data());
  if (latents.dtype() == DType::kBF16) {
    using B = __nv_bfloat16;
    PagedLatentWriteKernel<B><<<grid, kThreads, 0, ctx->stream()>>>(
        static_cast<const B*>(latents.raw_data()), slots, rows, d, num_slots,
        static_cast<B*>(pages->raw_data()));
  } else {
    PagedLatentWriteKernel<float><<<grid, kThreads, 0, ctx->stream()>>>(
        static_cast<const float*>(latents.raw_data()), slots, rows, d, num_slots,
        static_cast<float*>(pages->raw_data()));
  }
  return LastLaunchStatus("PagedLatentWriteKernel");
}

}  // namespace orrery::kernels::cuda
