// The optimizer step on the device (kernels/adamw_op.h): the squared gradient norm (block sums
// in f32, each block's total in f64 to its own slot, the slots added by LaunchColumnSums
// (column_sums.h) in an order fixed by the tensors' sizes: the same bits on every run), the
// clipping factor, and the AdamW update of one parameter with the factor read
// from device memory, so clipping needs no host round trip.
// Many tensors in one launch (AdamWStepMany, ZeroMany, SquaredNorm over a list): a table of the
// tensors' pointers and of fixed-size chunks (kChunk elements of one tensor per block) is copied
// to the device per call; a block finds its tensor in the chunk table. One launch per parameter
// cost 1,849 launches (16 ms device, 13 ms host) per step of `small`, most of them per-expert
// views.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cuda/column_sums.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void ClipFactorKernel(const double* sumsq, double max_norm, float* factor) {
  const double norm = sqrt(*sumsq);
  *factor = max_norm > 0 && norm > max_norm ? static_cast<float>(max_norm / (norm + 1e-12)) : 1.0f;
}

struct AdamWScalars {
  float b1, b2, eps, step_size, inv_sqrt_bc2, decay;
};

// One element's update in the CPU twin's expression order, every operation rounded on its own
// (the _rn intrinsics are never contracted into FMAs): the compiler's contraction choices may
// differ between kernels, and the per-tensor and the many-tensor steps must give the same bits.
__device__ __forceinline__ void AdamWElement(const AdamWScalars& c, float decay, float g, float f,
                                             float* w, float* m, float* v, __nv_bfloat16* w_bf16) {
  const float gi = __fmul_rn(g, f);
  const float mi = __fadd_rn(__fmul_rn(c.b1, *m), __fmul_rn(1.0f - c.b1, gi));
  const float vi = __fadd_rn(__fmul_rn(c.b2, *v), __fmul_rn(__fmul_rn(1.0f - c.b2, gi), gi));
  const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), c.inv_sqrt_bc2), c.eps);
  const float wi = __fsub_rn(__fmul_rn(*w, decay), __fdiv_rn(__fmul_rn(c.step_size, mi), denom));
  *m = mi;
  *v = vi;
  *w = wi;
  if (w_bf16 != nullptr) *w_bf16 = __float2bfloat16(wi);
}

__global__ void AdamWKernel(AdamWScalars c, const float* __restrict__ g,
                            const float* __restrict__ factor, int64_t n, float* __restrict__ w,
                            float* __restrict__ m, float* __restrict__ v,
                            __nv_bfloat16* __restrict__ w_bf16) {
  const float f = factor != nullptr ? *factor : 1.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    AdamWElement(c, c.decay, g[i], f, w + i, m + i, v + i,
                 w_bf16 != nullptr ? w_bf16 + i : nullptr);
  }
}

// ---- many tensors per launch ----
constexpr int64_t kChunk = int64_t{1} << 16;

struct ManyTensor {
  float *g, *w, *m, *v;
  __nv_bfloat16* w_bf16;
  float decay;
  int64_t n;
};
struct ManyChunk {
  int64_t tensor, begin;
};

// The chunks of tensors of sizes `sizes`, then a device copy of [tensors | chunks] (both trivially
// copyable): *tensors_dev and *chunks_dev point into `table`, which must outlive the launch (the
// caching allocator's reuse is ordered on the one stream, so the end of the call is enough).
template <typename T>
Status UploadTable(const std::vector<T>& tensors, const std::vector<int64_t>& sizes, Device device,
                   cudaStream_t s, Tensor* table, const T** tensors_dev,
                   const ManyChunk** chunks_dev, int64_t* num_chunks) {
  std::vector<ManyChunk> chunks;
  for (size_t i = 0; i < sizes.size(); ++i) {
    for (int64_t b = 0; b < sizes[i]; b += kChunk) chunks.push_back({static_cast<int64_t>(i), b});
  }
  *num_chunks = static_cast<int64_t>(chunks.size());
  const size_t tensor_bytes = (sizeof(T) * tensors.size() + 15) / 16 * 16;
  const size_t bytes = tensor_bytes + sizeof(ManyChunk) * chunks.size();
  std::vector<unsigned char> host(bytes);
  std::memcpy(host.data(), tensors.data(), sizeof(T) * tensors.size());
  std::memcpy(host.data() + tensor_bytes, chunks.data(), sizeof(ManyChunk) * chunks.size());
  ORRERY_ASSIGN_OR_RETURN(
      *table, Tensor::Allocate({static_cast<int64_t>((bytes + 7) / 8)}, DType::kI64, device));
  ORRERY_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(table->raw_data(), host.data(), bytes, cudaMemcpyHostToDevice, s),
                 "many-tensor table"));  // pageable: returns once `host` is staged
  auto* base = static_cast<unsigned char*>(table->raw_data());
  *tensors_dev = reinterpret_cast<const T*>(base);
  *chunks_dev = reinterpret_cast<const ManyChunk*>(base + tensor_bytes);
  return Status::OK();
}

__global__ void AdamWManyKernel(AdamWScalars c, const ManyTensor* __restrict__ tensors,
                                const ManyChunk* __restrict__ chunks,
                                const float* __restrict__ factor) {
  const ManyChunk ch = chunks[blockIdx.x];
  const ManyTensor t = tensors[ch.tensor];
  const float f = factor != nullptr ? *factor : 1.0f;
  const int64_t end = ch.begin + kChunk < t.n ? ch.begin + kChunk : t.n;
  for (int64_t i = ch.begin + threadIdx.x; i < end; i += blockDim.x) {
    AdamWElement(c, t.decay, t.g[i], f, t.w + i, t.m + i, t.v + i,
                 t.w_bf16 != nullptr ? t.w_bf16 + i : nullptr);
  }
}

struct PlainTensor {
  float* x;
  int64_t n;
};

__global__ void ZeroManyKernel(const PlainTensor* __restrict__ tensors,
                               const ManyChunk* __restrict__ chunks) {
  const ManyChunk ch = chunks[blockIdx.x];
  const PlainTensor t = tensors[ch.tensor];
  const int64_t end = ch.begin + kChunk < t.n ? ch.begin + kChunk : t.n;
  for (int64_t i = ch.begin + threadIdx.x; i < end; i += blockDim.x) t.x[i] = 0.0f;
}

// parts[chunk] = the chunk's sum of squares (f64).
__global__ void SquaredNormManyKernel(const PlainTensor* __restrict__ tensors,
                                      const ManyChunk* __restrict__ chunks,
                                      double* __restrict__ parts) {
  __shared__ float warp_sums[kThreads / 32];
  const ManyChunk ch = chunks[blockIdx.x];
  const PlainTensor t = tensors[ch.tensor];
  const int64_t end = ch.begin + kChunk < t.n ? ch.begin + kChunk : t.n;
  float s = 0.0f;
  for (int64_t i = ch.begin + threadIdx.x; i < end; i += blockDim.x) s += t.x[i] * t.x[i];
  s = WarpSum(s);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    parts[blockIdx.x] = total;
  }
}

// The launch over a table of plain tensors (zeroing, the squared norm).
template <typename Kernel, typename... Args>
Status LaunchPlain(const std::vector<Tensor>& xs, cudaStream_t s, const char* name, Kernel kernel,
                   Args... args) {
  std::vector<PlainTensor> tensors;
  std::vector<int64_t> sizes;
  for (const Tensor& x : xs) {
    tensors.push_back({x.data<float>(), x.numel()});
    sizes.push_back(x.numel());
  }
  Tensor table;
  const PlainTensor* t = nullptr;
  const ManyChunk* c = nullptr;
  int64_t chunks = 0;
  ORRERY_RETURN_IF_ERROR(UploadTable(tensors, sizes, xs[0].device(), s, &table, &t, &c, &chunks));
  if (chunks == 0) return Status::OK();
  kernel<<<static_cast<unsigned>(chunks), kThreads, 0, s>>>(t, c, args...);
  return LastLaunchStatus(name);
}

AdamWScalars ScalarsOf(const AdamWStepArgs& args) {
  const double bc1 = 1.0 - std::pow(args.beta1, static_cast<double>(args.step));
  const double bc2 = 1.0 - std::pow(args.beta2, static_cast<double>(args.step));
  AdamWScalars c;
  c.b1 = static_cast<float>(args.beta1);
  c.b2 = static_cast<float>(args.beta2);
  c.eps = static_cast<float>(args.eps);
  c.step_size = static_cast<float>(args.lr / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.decay = static_cast<float>(1.0 - args.lr * args.weight_decay);
  return c;
}

}  // namespace

Status SquaredNormCuda(const std::vector<Tensor>& xs, Tensor* sumsq) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(xs[0].device().index));
  int64_t chunks = 0;
  for (const Tensor& x : xs) chunks += (x.numel() + kChunk - 1) / kChunk;
  ORRERY_ASSIGN_OR_RETURN(
      Tensor parts, Tensor::Allocate({std::max<int64_t>(chunks, 1)}, DType::kF64, xs[0].device()));
  ORRERY_RETURN_IF_ERROR(LaunchPlain(xs, ctx->stream(), "SquaredNormManyKernel",
                                     SquaredNormManyKernel, parts.data<double>()));
  return LaunchColumnSums(parts.data<double>(), chunks, 1, false, sumsq->data<double>(),
                          ctx->stream());
}

Status ZeroManyCuda(const std::vector<Tensor>& xs) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(xs[0].device().index));
  return LaunchPlain(xs, ctx->stream(), "ZeroManyKernel", ZeroManyKernel);
}

Status AdamWStepManyCuda(const AdamWStepArgs& args, const Tensor& grad_factor,
                         const std::vector<AdamWTensors>& items) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(items[0].grad.device().index));
  const AdamWScalars c = ScalarsOf(args);
  const float no_decay = 1.0f;
  std::vector<ManyTensor> tensors;
  std::vector<int64_t> sizes;
  for (const AdamWTensors& it : items) {
    ManyTensor t;
    t.g = it.grad.data<float>();
    t.w = it.param.data<float>();
    t.m = it.m.data<float>();
    t.v = it.v.data<float>();
    t.w_bf16 =
        it.param_bf16.defined() ? static_cast<__nv_bfloat16*>(it.param_bf16.raw_data()) : nullptr;
    t.decay = it.decay ? c.decay : no_decay;
    t.n = it.grad.numel();
    tensors.push_back(t);
    sizes.push_back(t.n);
  }
  Tensor table;
  const ManyTensor* t = nullptr;
  const ManyChunk* ch = nullptr;
  int64_t chunks = 0;
  ORRERY_RETURN_IF_ERROR(
      UploadTable(tensors, sizes, items[0].grad.device(), ctx->stream(), &table, &t, &ch, &chunks));
  if (chunks == 0) return Status::OK();
  AdamWManyKernel<<<static_cast<unsigned>(chunks), kThreads, 0, ctx->stream()>>>(
      c, t, ch, grad_factor.defined() ? grad_factor.data<float>() : nullptr);
  return LastLaunchStatus("AdamWManyKernel");
}

Status ClipFactorCuda(const Tensor& sumsq, double max_norm, Tensor* factor) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(sumsq.device().index));
  ClipFactorKernel<<<1, 1, 0, ctx->stream()>>>(sumsq.data<double>(), max_norm,
                                               factor->data<float>());
  return LastLaunchStatus("ClipFactorKernel");
}

Status AdamWStepCuda(const AdamWStepArgs& args, const Tensor& grad, const Tensor& grad_factor,
                     Tensor* param, Tensor* m, Tensor* v, Tensor* param_bf16) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(grad.device().index));
  const AdamWScalars c = ScalarsOf(args);
  const int64_t n = grad.numel();
  AdamWKernel<<<GridFor(n, kThreads), kThreads, 0, ctx->stream()>>>(
      c, grad.data<float>(), grad_factor.defined() ? grad_factor.data<float>() : nullptr, n,
      param->data<float>(), m->data<float>(), v->data<float>(),
      param_bf16->defined() ? static_cast<__nv_bfloat16*>(param_bf16->raw_data()) : nullptr);
  return LastLaunchStatus("AdamWKernel");
}

}  // namespace orrery::kernels::cuda
