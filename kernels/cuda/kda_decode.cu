// KDA decode on the GPU: N sequences advance one token each, the fp32 state updated in place.
//
// Memory-bound: each (sequence, head) state slice is read once and written once. A block of
// 32 x 8 threads owns a K x 32 slice (threadIdx.x walks V, so each row access is one coalesced
// 128-byte line; threadIdx.y strides over K); the two reductions over K (S^T k and S^T q) go
// through shared memory. K = 64 or 128 with V % 4 == 0 takes the wide (float4) path below. The
// arithmetic order equals the recurrent reference up to the summation order of those reductions.
#include <cuda_bf16.h>

#include <cstdint>

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

// The wide path for K = 8R (64 or 128) and V a multiple of 4: a block of 32 x 8 threads owns a
// K x 128 slice; each thread holds R rows of 4 adjacent V columns (float4: one 512-byte line per
// warp and row), all R loads issued before any arithmetic so that 16R bytes per thread are in
// flight. k, q and e^g are staged in shared memory once per block.
template <typename In, typename GIn, int R>
__global__ void __launch_bounds__(kSliceV* kRows)
    KdaDecodeWideKernel(const In* q, const In* k, const In* v, const GIn* g, const In* beta,
                        float scale, int vd, float* state, In* o) {
  constexpr int kd = R * kRows, kWide = 4 * kSliceV;
  __shared__ float red[kRows][kWide];
  __shared__ float ks[kd], qs[kd], es[kd];
  const int nh = blockIdx.x;
  const int x = threadIdx.x, y = threadIdx.y, tid = y * kSliceV + x;
  const int c0 = blockIdx.y * kWide + 4 * x;
  const bool active = c0 < vd;
  const int64_t qk = static_cast<int64_t>(nh) * kd;
  for (int d = tid; d < kd; d += kSliceV * kRows) {
    ks[d] = LoadF(k + qk + d);
    qs[d] = LoadF(q + qk + d);
    es[d] = __expf(LoadF(g + qk + d));
  }
  float4* s = reinterpret_cast<float4*>(state + static_cast<int64_t>(nh) * kd * vd + c0);
  const int row4 = vd / 4;  // float4 stride between rows
  float4 sv[R];
  if (active) {
#pragma unroll
    for (int i = 0; i < R; ++i) sv[i] = s[static_cast<int64_t>(y + i * kRows) * row4];
  }
  __syncthreads();
  float4 part = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (active) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int d = y + i * kRows;
      const float e = es[d], kk = ks[d];
      sv[i].x *= e;
      sv[i].y *= e;
      sv[i].z *= e;
      sv[i].w *= e;
      part.x += kk * sv[i].x;
      part.y += kk * sv[i].y;
      part.z += kk * sv[i].z;
      part.w += kk * sv[i].w;
    }
  }
  reinterpret_cast<float4*>(red[y])[x] = part;
  __syncthreads();
  float4 u = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (active) {
    float4 pk = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float4 t = reinterpret_cast<const float4*>(red[r])[x];
      pk.x += t.x;
      pk.y += t.y;
      pk.z += t.z;
      pk.w += t.w;
    }
    const float b = LoadF(beta + nh);
    const In* vp = v + static_cast<int64_t>(nh) * vd + c0;
    u = make_float4(b * (LoadF(vp) - pk.x), b * (LoadF(vp + 1) - pk.y), b * (LoadF(vp + 2) - pk.z),
                    b * (LoadF(vp + 3) - pk.w));
  }
  __syncthreads();
  part = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (active) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int d = y + i * kRows;
      const float kk = ks[d], qq = qs[d];
      sv[i].x += kk * u.x;
      sv[i].y += kk * u.y;
      sv[i].z += kk * u.z;
      sv[i].w += kk * u.w;
      s[static_cast<int64_t>(d) * row4] = sv[i];
      part.x += qq * sv[i].x;
      part.y += qq * sv[i].y;
      part.z += qq * sv[i].z;
      part.w += qq * sv[i].w;
    }
  }
  reinterpret_cast<float4*>(red[y])[x] = part;
  __syncthreads();
  if (y == 0 && active) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float4 t = reinterpret_cast<const float4*>(red[r])[x];
      acc.x += t.x;
      acc.y += t.y;
      acc.z += t.z;
      acc.w += t.w;
    }
    In* op = o + static_cast<int64_t>(nh) * vd + c0;
    StoreF(op, scale * acc.x);
    StoreF(op + 1, scale * acc.y);
    StoreF(op + 2, scale * acc.z);
    StoreF(op + 3, scale * acc.w);
  }
}

template <typename In, typename GIn, int R>
Status LaunchWide(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                  const Tensor& beta, float scale, Tensor* state, Tensor* o) {
  const int n = static_cast<int>(q.dim(0)), heads = static_cast<int>(q.dim(1));
  const int vd = static_cast<int>(v.dim(2));
  const dim3 grid(static_cast<unsigned>(n * heads),
                  static_cast<unsigned>((vd + 4 * kSliceV - 1) / (4 * kSliceV)));
  const dim3 block(kSliceV, kRows);
  KdaDecodeWideKernel<In, GIn, R>
      <<<grid, block>>>(static_cast<const In*>(q.raw_data()), static_cast<const In*>(k.raw_data()),
                        static_cast<const In*>(v.raw_data()), static_cast<const GIn*>(g.raw_data()),
                        static_cast<const In*>(beta.raw_data()), scale, vd, state->data<float>(),
                        static_cast<In*>(o->raw_data()));
  return CudaCheck(cudaGetLastError(), "decode kernel launch");
}

template <typename In, typename GIn>
Status Launch(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
              const Tensor& beta, float scale, Tensor* state, Tensor* o) {
  const int n = static_cast<int>(q.dim(0)), heads = static_cast<int>(q.dim(1));
  const int kd = static_cast<int>(q.dim(2)), vd = static_cast<int>(v.dim(2));
  // The state rows must be 16-byte aligned for the float4 path (V % 4 == 0, aligned base).
  const bool aligned = vd % 4 == 0 && reinterpret_cast<uintptr_t>(state->raw_data()) % 16 == 0;
  if (aligned && kd == 128) return LaunchWide<In, GIn, 16>(q, k, v, g, beta, scale, state, o);
  if (aligned && kd == 64) return LaunchWide<In, GIn, 8>(q, k, v, g, beta, scale, state, o);
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
