// KDA decode on the GPU: N sequences advance one token each, the fp32 state updated in place.
//
// Memory-bound: each (sequence, head) state slice is read once and written once. A block of
// 32 x 8 threads owns a K x 32 slice (threadIdx.x walks V, so each row access is one coalesced
// 128-byte line; threadIdx.y strides over K); the two reductions over K (S^T k and S^T q) go
// through shared memory. The arithmetic order equals the recurrent reference up to the
// summation order of those reductions.
#include <cuda_bf16.h>

#include "kernels/cuda/kda_cuda.h"
#include "kernels/cuda/kda_cuda_util.cuh"

namespace orrery::kernels::cuda {
namespace {

constexpr int kSliceV = 32;
constexpr int kRows = 8;
constexpr int kMaxPerThread = 32;  // K <= 256

template <typename In, typename GIn>
__global__ void __launch_bounds__(kSliceV* kRows)
    KdaDecodeKernel(const In* q, const In* k, const In* v, const GIn* g, const In* beta,
                    float scale, int heads, int kd, int vd, float* state, In* o) {
  __shared__ float red[kRows][kSliceV];
  const int nh = blockIdx.x;
  const int v0 = blockIdx.y * kSliceV;
  const int j = threadIdx.x, y = threadIdx.y;
  const bool active = v0 + j < vd;
  float* s = state + static_cast<int64_t>(nh) * kd * vd + v0 + j;
  const int64_t qk = static_cast<int64_t>(nh) * kd;
  float sv[kMaxPerThread];
  float part = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxPerThread; ++i) {
    const int d = y + i * kRows;
    sv[i] = 0.0f;
    if (d < kd && active) {
      sv[i] = s[static_cast<int64_t>(d) * vd] * __expf(LoadF(g + qk + d));
      part += LoadF(k + qk + d) * sv[i];
    }
  }
  red[y][j] = part;
  __syncthreads();
  float pk = 0.0f;
#pragma unroll
  for (int r = 0; r < kRows; ++r) pk += red[r][j];
  const float u =
      active ? LoadF(beta + nh) * (LoadF(v + static_cast<int64_t>(nh) * vd + v0 + j) - pk) : 0.0f;
  __syncthreads();
  part = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxPerThread; ++i) {
    const int d = y + i * kRows;
    if (d < kd && active) {
      sv[i] += LoadF(k + qk + d) * u;
      s[static_cast<int64_t>(d) * vd] = sv[i];
      part += LoadF(q + qk + d) * sv[i];
    }
  }
  red[y][j] = part;
  __syncthreads();
  if (y == 0 && active) {
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc += red[r][j];
    StoreF(o + static_cast<int64_t>(nh) * vd + v0 + j, scale * acc);
  }
}

template <typename In, typename GIn>
Status Launch(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
              const Tensor& beta, float scale, Tensor* state, Tensor* o) {
  const int n = static_cast<int>(q.dim(0)), heads = static_cast<int>(q.dim(1));
  const int kd = static_cast<int>(q.dim(2)), vd = static_cast<int>(v.dim(2));
  const dim3 grid(static_cast<unsigned>(n * heads),
                  static_cast<unsigned>((vd + kSliceV - 1) / kSliceV));
  const dim3 block(kSliceV, kRows);
  KdaDecodeKernel<In, GIn>
      <<<grid, block>>>(static_cast<const In*>(q.raw_data()), static_cast<const In*>(k.raw_data()),
                        static_cast<const In*>(v.raw_data()), static_cast<const GIn*>(g.raw_data()),
                        static_cast<const In*>(beta.raw_data()), scale, heads, kd, vd,
                        state->data<float>(), static_cast<In*>(o->raw_data()));
  return CudaCheck(cudaGetLastError(), "decode kernel launch");
}

}  // namespace

Status KdaDecodeStepCuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                         const Tensor& beta, float scale, Tensor* state, Tensor* o) {
  if (state->dtype() != DType::kF32) {
    return InvalidArgumentError("kda decode: state " + state->ToString() + ", expected f32");
  }
  if (q.dim(0) == 0) return Status::OK();
  if (q.dtype() == DType::kBF16) {
    return g.dtype() == DType::kF32
               ? Launch<__nv_bfloat16, float>(q, k, v, g, beta, scale, state, o)
               : Launch<__nv_bfloat16, __nv_bfloat16>(q, k, v, g, beta, scale, state, o);
  }
  return Launch<float, float>(q, k, v, g, beta, scale, state, o);
}

}  // namespace orrery::kernels::cuda
