// Embedding gather and scatter-add (kernels/embedding.h): one warp per token row, grid-stride
// over rows. An out-of-range id is not read or written; the first such position is kept in a
// device flag (atomicMin) that the op reads back once per call.
// Not yet timed: correct first (issue 22).
#include <climits>

#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;

template <typename T>
__global__ void GatherKernel(const T* __restrict__ table, const int32_t* __restrict__ ids,
                             int64_t n, int64_t vocab, int64_t d, T* __restrict__ y, int* bad) {
  const int lane = threadIdx.x % 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < n;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int32_t id = ids[r];
    if (id < 0 || id >= vocab) {
      if (lane == 0 && bad != nullptr) atomicMin(bad, static_cast<int>(r));
      continue;
    }
    const T* src = table + static_cast<int64_t>(id) * d;
    T* dst = y + r * d;
    for (int64_t i = lane; i < d; i += 32) dst[i] = src[i];
  }
}

template <typename T>
__global__ void ScatterAddKernel(const int32_t* __restrict__ ids, const T* __restrict__ dy,
                                 int64_t n, int64_t vocab, int64_t d, float* __restrict__ dtable,
                                 int* bad) {
  const int lane = threadIdx.x % 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < n;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int32_t id = ids[r];
    if (id < 0 || id >= vocab) {
      if (lane == 0) atomicMin(bad, static_cast<int>(r));
      continue;
    }
    float* dst = dtable + static_cast<int64_t>(id) * d;
    const T* g = dy + r * d;
    for (int64_t i = lane; i < d; i += 32) atomicAdd(&dst[i], ToF(g[i]));
  }
}

// The flag's first bad position, or OK.
Status CheckFlag(const char* op, const Tensor& flag, const Tensor& ids, int64_t vocab,
                 cudaStream_t s) {
  int pos = INT_MAX;
  ORRERY_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(&pos, flag.raw_data(), sizeof(int), cudaMemcpyDeviceToHost, s), op));
  ORRERY_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(s), op));
  if (pos == INT_MAX) return Status::OK();
  int32_t id = 0;
  ORRERY_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpy(&id, ids.data<int32_t>() + pos, sizeof(int32_t), cudaMemcpyDeviceToHost), op));
  return OutOfRangeError(std::string(op) + ": ids[" + std::to_string(pos) + "] = " +
                         std::to_string(id) + ", expected [0, " + std::to_string(vocab) + ")");
}

StatusOr<Tensor> NewFlag(Device device, cudaStream_t s) {
  ORRERY_ASSIGN_OR_RETURN(Tensor flag, Tensor::Allocate({1}, DType::kI32, device));
  const int init = INT_MAX;
  ORRERY_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(flag.raw_data(), &init, sizeof(int), cudaMemcpyHostToDevice, s),
                 "embedding flag"));
  return flag;
}

}  // namespace

Status EmbeddingGatherCuda(const Tensor& table, const Tensor& ids, bool check_ids, Tensor* y) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(table.device().index));
  Tensor flag;
  if (check_ids) {
    ORRERY_ASSIGN_OR_RETURN(flag, NewFlag(table.device(), ctx->stream()));
  }
  int* bad = check_ids ? flag.data<int32_t>() : nullptr;
  const int64_t n = ids.numel(), v = table.dim(0), d = table.dim(1);
  const unsigned grid = GridFor(n, kWarps);
  if (table.dtype() == DType::kBF16) {
    GatherKernel<__nv_bfloat16><<<grid, kThreads, 0, ctx->stream()>>>(
        static_cast<const __nv_bfloat16*>(table.raw_data()), ids.data<int32_t>(), n, v, d,
        static_cast<__nv_bfloat16*>(y->raw_data()), bad);
  } else {
    GatherKernel<float><<<grid, kThreads, 0, ctx->stream()>>>(
        table.data<float>(), ids.data<int32_t>(), n, v, d, y->data<float>(), bad);
  }
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("GatherKernel"));
  return check_ids ? CheckFlag("embedding", flag, ids, v, ctx->stream()) : Status::OK();
}

Status EmbeddingScatterAddCuda(const Tensor& ids, const Tensor& dy, Tensor* dtable) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(dy.device().index));
  ORRERY_ASSIGN_OR_RETURN(Tensor flag, NewFlag(dy.device(), ctx->stream()));
  const int64_t n = ids.numel(), v = dtable->dim(0), d = dtable->dim(1);
  const unsigned grid = GridFor(n, kWarps);
  if (dy.dtype() == DType::kBF16) {
    ScatterAddKernel<__nv_bfloat16><<<grid, kThreads, 0, ctx->stream()>>>(
        ids.data<int32_t>(), static_cast<const __nv_bfloat16*>(dy.raw_data()), n, v, d,
        dtable->data<float>(), flag.data<int32_t>());
  } else {
    ScatterAddKernel<float>
        <<<grid, kThreads, 0, ctx->stream()>>>(ids.data<int32_t>(), dy.data<float>(), n, v, d,
                                               dtable->data<float>(), flag.data<int32_t>());
  }
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("ScatterAddKernel"));
  return CheckFlag("embedding_backward", flag, ids, v, ctx->stream());
}

}  // namespace orrery::kernels::cuda
