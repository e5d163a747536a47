// KDA decode on the GPU: N sequences advance one token each, the fp32 state updated in place
// (kernels/kda.h, KdaDecodeStep).
//
// Memory-bound: each (sequence, head) state slice is read once and written once. A block of
// 32 x 8 threads owns one (sequence, head) and a slice of V. It first stages the head's k, q and
// e^g rows in shared memory, applying the op's input transforms as it loads when asked (the q/k
// L2 norm by a block reduction, the gate from its pre-activation with A_log and dt_bias, the beta
// sigmoid: the formulas of the elementwise pass of kda_input_transforms.cu, in f32), so the
// inference engine's decode needs no pass of its own for them. The state slice is row rows[n] of
// a state table when rows are given (no gather and scatter of the slots' states around the step).
// Then two reductions over K (S^T k and S^T q) go through shared memory:
//   generic: a K x 32 slice, threadIdx.x walks V (each row access one coalesced 128-byte line),
//       threadIdx.y strides over K (K <= 256);
//   wide (K = 8R, 64 or 128, V % 4 == 0, 16-byte aligned state): a K x 128 slice, each thread
//       holding R rows of 4 adjacent V columns (float4: one 512-byte line per warp and row), all R
//       loads issued before any arithmetic so that 16R bytes per thread are in flight.
// The arithmetic order equals the recurrent reference up to the summation order of the
// reductions. Not yet timed in this form (transforms and rows added; the plain step measured
// with kda_gpu_bench).
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/kda_cuda.h"
#include "kernels/cuda/kda_cuda_util.cuh"

namespace orrery::kernels::cuda {
namespace {

constexpr int kSliceV = 32;
constexpr int kRows = 8;
constexpr int kThreads = kSliceV * kRows;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxK = 256;
constexpr int kMaxPerThread = kMaxK / kRows;

template <typename In, typename GIn>
struct DecodeParams {
  const In *q, *k, *v, *beta;
  const GIn* g;
  const int32_t* rows;  // null: sequence n's state is row n
  float* state;
  In* o;
  float scale;
  int heads, kd, vd;
  ChunkInputTransforms tr;
};

// The sum of `x` over the block (every thread gets it); `scratch` holds kWarps floats.
__device__ __forceinline__ float BlockSum(float x, float* scratch) {
  const int tid = threadIdx.y * kSliceV + threadIdx.x;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  __syncthreads();  // scratch may still be read by a previous call
  if (tid % 32 == 0) scratch[tid / 32] = x;
  __syncthreads();
  float sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) sum += scratch[w];
  return sum;
}

// Stages k, q (L2-normalised with transforms.qk_l2norm) and e^g (g from its pre-activation with
// transforms.gate) of head nh in shared memory; returns beta (after the sigmoid with
// transforms.beta_sigmoid). Ends with a barrier.
template <typename In, typename GIn>
__device__ __forceinline__ float Stage(const DecodeParams<In, GIn>& p, int nh, float* ks, float* qs,
                                       float* es, float* scratch) {
  const int tid = threadIdx.y * kSliceV + threadIdx.x, h = nh % p.heads, kd = p.kd;
  const int64_t qk = static_cast<int64_t>(nh) * kd;
  const float ea = p.tr.gate && p.tr.a_log != nullptr ? __expf(p.tr.a_log[h]) : 1.0f;
  float sq = 0.0f, sk = 0.0f;
  for (int d = tid; d < kd; d += kThreads) {
    const float q = LoadF(p.q + qk + d), k = LoadF(p.k + qk + d);
    float g = LoadF(p.g + qk + d);
    if (p.tr.gate) {
      const float b = p.tr.dt_bias != nullptr ? p.tr.dt_bias[h * kd + d] : 0.0f;
      g = KdaGateValue(g + b, ea, p.tr.bounded, p.tr.g_min);
    }
    qs[d] = q;
    ks[d] = k;
    es[d] = __expf(g);
    sq += q * q;
    sk += k * k;
  }
  if (p.tr.qk_l2norm) {
    const float rq = rsqrtf(BlockSum(sq, scratch) + p.tr.eps);
    const float rk = rsqrtf(BlockSum(sk, scratch) + p.tr.eps);
    for (int d = tid; d < kd; d += kThreads) {
      qs[d] *= rq;
      ks[d] *= rk;
    }
  }
  __syncthreads();
  const float b = LoadF(p.beta + nh);
  return p.tr.beta_sigmoid ? SigmoidF(b) : b;
}

// Head nh's state slice: row rows[n] (or n) of the table, head nh % heads; null for a padding
// row (rows[n] < 0: a zero state, nothing written).
template <typename In, typename GIn>
__device__ __forceinline__ float* StateOf(const DecodeParams<In, GIn>& p, int nh) {
  const int n = nh / p.heads, h = nh % p.heads;
  const int64_t row = p.rows != nullptr ? p.rows[n] : n;
  if (row < 0) return nullptr;
  return p.state + (row * p.heads + h) * static_cast<int64_t>(p.kd) * p.vd;
}

template <typename In, typename GIn>
__global__ void __launch_bounds__(kThreads) KdaDecodeKernel(DecodeParams<In, GIn> p) {
  __shared__ float red[kRows][kSliceV];
  __shared__ float ks[kMaxK], qs[kMaxK], es[kMaxK], scratch[kWarps];
  const int nh = blockIdx.x, kd = p.kd, vd = p.vd;
  const int v0 = blockIdx.y * kSliceV;
  const int j = threadIdx.x, y = threadIdx.y;
  const bool active = v0 + j < vd;
  const float beta = Stage(p, nh, ks, qs, es, scratch);
  float* const base = StateOf(p, nh);
  const bool keep = base != nullptr;
  float* s = keep ? base + v0 + j : nullptr;
  float sv[kMaxPerThread];
  float part = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxPerThread; ++i) {
    const int d = y + i * kRows;
    sv[i] = 0.0f;
    if (d < kd && active) {
      sv[i] = keep ? s[static_cast<int64_t>(d) * vd] * es[d] : 0.0f;
      part += ks[d] * sv[i];
    }
  }
  red[y][j] = part;
  __syncthreads();
  float pk = 0.0f;
#pragma unroll
  for (int r = 0; r < kRows; ++r) pk += red[r][j];
  const float u = active ? beta * (LoadF(p.v + static_cast<int64_t>(nh) * vd + v0 + j) - pk) : 0.0f;
  __syncthreads();
  part = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxPerThread; ++i) {
    const int d = y + i * kRows;
    if (d < kd && active) {
      sv[i] += ks[d] * u;
      if (keep) s[static_cast<int64_t>(d) * vd] = sv[i];
      part += qs[d] * sv[i];
    }
  }
  red[y][j] = part;
  __syncthreads();
  if (y == 0 && active) {
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc += red[r][j];
    StoreF(p.o + static_cast<int64_t>(nh) * vd + v0 + j, p.scale * acc);
  }
}

template <typename In, typename GIn, int R>
__global__ void __launch_bounds__(kThreads) KdaDecodeWideKernel(DecodeParams<In, GIn> p) {
  constexpr int kd = R * kRows, kWide = 4 * kSliceV;
  __shared__ float red[kRows][kWide];
  __shared__ float ks[kd], qs[kd], es[kd], scratch[kWarps];
  const int nh = blockIdx.x, vd = p.vd;
  const int x = threadIdx.x, y = threadIdx.y;
  const int c0 = blockIdx.y * kWide + 4 * x;
  const bool active = c0 < vd;
  float* const base = StateOf(p, nh);
  const bool keep = base != nullptr;
  float4* s = keep ? reinterpret_cast<float4*>(base + c0) : nullptr;
  const int row4 = vd / 4;  // float4 stride between rows
  float4 sv[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    sv[i] = active && keep ? s[static_cast<int64_t>(y + i * kRows) * row4]
                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  const float beta = Stage(p, nh, ks, qs, es, scratch);
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
    const In* vp = p.v + static_cast<int64_t>(nh) * vd + c0;
    u = make_float4(beta * (LoadF(vp) - pk.x), beta * (LoadF(vp + 1) - pk.y),
                    beta * (LoadF(vp + 2) - pk.z), beta * (LoadF(vp + 3) - pk.w));
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
      if (keep) s[static_cast<int64_t>(d) * row4] = sv[i];
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
    In* op = p.o + static_cast<int64_t>(nh) * vd + c0;
    StoreF(op, p.scale * acc.x);
    StoreF(op + 1, p.scale * acc.y);
    StoreF(op + 2, p.scale * acc.z);
    StoreF(op + 3, p.scale * acc.w);
  }
}

template <typename In, typename GIn>
Status Launch(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
              const Tensor& beta, float scale, const KdaDecodeOptions& options, Tensor* state,
              Tensor* o) {
  DecodeParams<In, GIn> p;
  p.q = static_cast<const In*>(q.raw_data());
  p.k = static_cast<const In*>(k.raw_data());
  p.v = static_cast<const In*>(v.raw_data());
  p.beta = static_cast<const In*>(beta.raw_data());
  p.g = static_cast<const GIn*>(g.raw_data());
  p.rows = options.rows.defined() ? options.rows.data<int32_t>() : nullptr;
  p.state = state->data<float>();
  p.o = static_cast<In*>(o->raw_data());
  p.scale = scale;
  p.heads = static_cast<int>(q.dim(1));
  p.kd = static_cast<int>(q.dim(2));
  p.vd = static_cast<int>(v.dim(2));
  KdaInputs params;
  params.a_log = options.a_log;
  params.dt_bias = options.dt_bias;
  p.tr = MakeChunkInputTransforms(options.transforms, params);
  const int n = static_cast<int>(q.dim(0));
  ORRERY_ASSIGN_OR_RETURN(const cudaStream_t stream, StreamOf(q.device()));
  // The state rows must be 16-byte aligned for the float4 path (V % 4 == 0, aligned base).
  const bool aligned = p.vd % 4 == 0 && reinterpret_cast<uintptr_t>(state->raw_data()) % 16 == 0;
  const dim3 block(kSliceV, kRows);
  if (aligned && (p.kd == 128 || p.kd == 64)) {
    const dim3 grid(static_cast<unsigned>(n * p.heads),
                    static_cast<unsigned>((p.vd + 4 * kSliceV - 1) / (4 * kSliceV)));
    if (p.kd == 128) {
      KdaDecodeWideKernel<In, GIn, 16><<<grid, block, 0, stream>>>(p);
    } else {
      KdaDecodeWideKernel<In, GIn, 8><<<grid, block, 0, stream>>>(p);
    }
  } else {
    const dim3 grid(static_cast<unsigned>(n * p.heads),
                    static_cast<unsigned>((p.vd + kSliceV - 1) / kSliceV));
    KdaDecodeKernel<In, GIn><<<grid, block, 0, stream>>>(p);
  }
  return CudaCheck(cudaGetLastError(), "decode kernel launch");
}

}  // namespace

Status KdaDecodeStepCuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                         const Tensor& beta, float scale, const KdaDecodeOptions& options,
                         Tensor* state, Tensor* o) {
  if (state->dtype() != DType::kF32) {
    return InvalidArgumentError("kda decode: state " + state->ToString() + ", expected f32");
  }
  if (q.dim(2) > kMaxK) {
    return UnimplementedError("kda decode: K = " + std::to_string(q.dim(2)) +
                              ", the CUDA kernel takes K <= " + std::to_string(kMaxK));
  }
  if (q.dim(0) == 0) return Status::OK();
  if (q.dtype() == DType::kBF16) {
    return g.dtype() == DType::kF32
               ? Launch<__nv_bfloat16, float>(q, k, v, g, beta, scale, options, state, o)
               : Launch<__nv_bfloat16, __nv_bfloat16>(q, k, v, g, beta, scale, options, state, o);
  }
  return Launch<float, float>(q, k, v, g, beta, scale, options, state, o);
}

}  // namespace orrery::kernels::cuda
