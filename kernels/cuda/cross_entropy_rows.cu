// The row-wise softmax cross-entropy of the fused LM head + loss (kernels/lm_head_loss.h): one
// block of 256 threads per logits row (V up to the vocabulary), three passes over the row in
// f32: the max, the sum of exponentials, then (backward) dz = scale m (softmax - onehot) written
// over the logits or into a bf16 buffer. Each row's weighted loss goes to its slot of an f64
// scratch (zero for a row without a target), and LaunchColumnSums (column_sums.h) adds the chunk's
// slots into the f64 accumulator in an order fixed by the row count: the same bits on every run.
// Not yet timed: correct first (issue 22).
#include <climits>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/column_sums.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kThreads = 256;

template <typename D>
__global__ void RowsCrossEntropyKernel(float* logits, const int32_t* __restrict__ targets,
                                       const float* __restrict__ mask, int64_t v, float scale,
                                       bool backward, int64_t row0, D* dz, double* row_loss,
                                       int* flag) {
  __shared__ float scratch[kThreads / 32];
  const int64_t r = blockIdx.x;
  float* z = logits + r * v;
  D* out = dz + r * v;
  const float weight = mask != nullptr ? mask[r] : 1.0f;
  const int32_t t = targets[r];
  if (weight == 0.0f || t < 0 || t >= v) {
    if (threadIdx.x == 0) {
      row_loss[r] = 0.0;
      // An exact integer minimum: the same whatever the order of the rows.
      if (weight != 0.0f) atomicMin(flag, static_cast<int>(row0 + r));
    }
    if (backward) {
      for (int64_t i = threadIdx.x; i < v; i += kThreads) out[i] = FromF<D>(0.0f);
    }
    return;
  }
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < v; i += kThreads) mx = fmaxf(mx, z[i]);
  mx = BlockReduce<true, kThreads>(mx, scratch);
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < v; i += kThreads) sum += expf(z[i] - mx);
  sum = BlockReduce<false, kThreads>(sum, scratch);
  const float lse = mx + logf(sum);
  const float zt = z[t];  // read before the backward overwrites the row
  __syncthreads();
  if (threadIdx.x == 0) row_loss[r] = static_cast<double>(weight) * (lse - zt);
  if (!backward) return;
  const float s = scale * weight;
  for (int64_t i = threadIdx.x; i < v; i += kThreads) {
    const float p = expf(z[i] - lse);
    out[i] = FromF<D>(s * (p - (i == t ? 1.0f : 0.0f)));
  }
}

}  // namespace

Status LossAccumulatorsCuda(Device device, Tensor* acc, Tensor* flag) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(device.index));
  ORRERY_ASSIGN_OR_RETURN(*acc, Tensor::Allocate({1}, DType::kF64, device));
  ORRERY_ASSIGN_OR_RETURN(*flag, Tensor::Allocate({1}, DType::kI32, device));
  ORRERY_RETURN_IF_ERROR(CudaStatus(
      cudaMemsetAsync(acc->raw_data(), 0, sizeof(double), ctx->stream()), "loss accumulator"));
  const int init = INT_MAX;
  return CudaStatus(
      cudaMemcpyAsync(flag->raw_data(), &init, sizeof(int), cudaMemcpyHostToDevice, ctx->stream()),
      "loss flag");
}

Status RowsCrossEntropyCuda(const Tensor& logits, const Tensor& targets, const Tensor& mask,
                            float scale, bool backward, int64_t row0, Tensor* dz, Tensor* acc,
                            Tensor* flag) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(logits.device().index));
  const int64_t rows = logits.dim(0), v = logits.dim(1);
  const float* m = mask.defined() ? mask.data<float>() : nullptr;
  float* z = static_cast<float*>(logits.raw_data());
  ORRERY_ASSIGN_OR_RETURN(Tensor row_loss, Tensor::Allocate({rows}, DType::kF64, logits.device()));
  if (dz->dtype() == DType::kBF16) {
    RowsCrossEntropyKernel<__nv_bfloat16>
        <<<static_cast<unsigned>(rows), kThreads, 0, ctx->stream()>>>(
            z, targets.data<int32_t>(), m, v, scale, backward, row0,
            static_cast<__nv_bfloat16*>(dz->raw_data()), row_loss.data<double>(),
            flag->data<int32_t>());
  } else {
    RowsCrossEntropyKernel<float><<<static_cast<unsigned>(rows), kThreads, 0, ctx->stream()>>>(
        z, targets.data<int32_t>(), m, v, scale, backward, row0,
        static_cast<float*>(dz->raw_data()), row_loss.data<double>(), flag->data<int32_t>());
  }
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("RowsCrossEntropyKernel"));
  return LaunchColumnSums(row_loss.data<double>(), rows, 1, true, acc->data<double>(),
                          ctx->stream());
}

Status ReadLossCuda(const Tensor& acc, const Tensor& flag, const Tensor& targets, int64_t vocab,
                    double* loss_sum) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(acc.device().index));
  int bad = INT_MAX;
  ORRERY_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(loss_sum, acc.raw_data(), sizeof(double),
                                                    cudaMemcpyDeviceToHost, ctx->stream()),
                                    "loss read back"));
  ORRERY_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(&bad, flag.raw_data(), sizeof(int), cudaMemcpyDeviceToHost, ctx->stream()),
      "loss flag read back"));
  ORRERY_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(ctx->stream()), "loss sync"));
  if (bad == INT_MAX) return Status::OK();
  int32_t t = 0;
  ORRERY_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpy(&t, targets.data<int32_t>() + bad, sizeof(int32_t), cudaMemcpyDeviceToHost),
      "target read back"));
  return OutOfRangeError("lm_head_loss: targets[" + std::to_string(bad) + "] = " +
                         std::to_string(t) + ", expected [0, " + std::to_string(vocab) + ")");
}

}  // namespace orrery::kernels::cuda
