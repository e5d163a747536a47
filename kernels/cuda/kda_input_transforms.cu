// KdaInputTransforms on the GPU: the q/k L2 norm, the beta sigmoid and the gate activation
// (bounded g_min sigmoid(e^A (z + b)) or original -e^A softplus(z + b), spec §2.2) in one
// elementwise pass before the recurrence, and their chain rule in one pass after its backward.
//
// Both kernels: a block per (head, run of kTokens tokens), one warp per token row at a time. With
// kVec = 4 (K a multiple of 4, 16-byte aligned rows: what the model and the benchmarks give) lane
// l holds the columns 4 l .. 4 l + 3 of each 128 and moves them in one access; kVec = 1 serves
// any other K (lane l on the columns l, l + 32, ...). The backward sums dA_log and ddt_bias over
// its tokens in registers and shared memory (warps in order) into its block's row of a scratch,
// and LaunchColumnSums (column_sums.h) adds the rows in a fixed order: no float atomics, the same
// bits on every run.
#include <cuda_bf16.h>

#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/column_sums.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/kda_cuda.h"
#include "kernels/cuda/kda_cuda_util.cuh"

namespace orrery::kernels::cuda {
namespace {

constexpr int kThreads = 128;  // 4 warps
constexpr int kWarps = kThreads / 32;
constexpr int kTokens = 256;    // token rows per block
constexpr int kMaxPerLane = 8;  // K <= 256

__device__ __forceinline__ float WarpSum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

struct TransformParams {
  int64_t rows;  // B * T
  int heads, kd;
  ChunkInputTransforms tr;
};

template <typename In, typename GIn>
struct ForwardArgs {
  const In *q, *k, *beta;
  const GIn* z;
  In *q_out, *k_out, *beta_out;
  float *g_out, *q_rstd, *k_rstd;
};

// The column of a lane's e-th element of a row (e < kMaxPerLane).
template <int kVec>
__device__ __forceinline__ int Column(int e, int lane) {
  return (e / kVec) * 32 * kVec + lane * kVec + e % kVec;
}

// A lane's elements of one row of `kd` (zeros past its end).
template <int kVec, typename T>
__device__ __forceinline__ void LoadRow(const T* row, int kd, int lane, float (&v)[kMaxPerLane]) {
#pragma unroll
  for (int e = 0; e < kMaxPerLane; e += kVec) {
    const int d = Column<kVec>(e, lane);
    if constexpr (kVec == 4) {
      const float4 x = d < kd ? LoadF4(row + d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      v[e] = x.x, v[e + 1] = x.y, v[e + 2] = x.z, v[e + 3] = x.w;
    } else {
      v[e] = d < kd ? LoadF(row + d) : 0.0f;
    }
  }
}

template <int kVec, typename T>
__device__ __forceinline__ void StoreRow(T* row, int kd, int lane, const float (&v)[kMaxPerLane]) {
#pragma unroll
  for (int e = 0; e < kMaxPerLane; e += kVec) {
    const int d = Column<kVec>(e, lane);
    if (d >= kd) continue;
    if constexpr (kVec == 4) {
      StoreF4(row + d, make_float4(v[e], v[e + 1], v[e + 2], v[e + 3]));
    } else {
      StoreF(row + d, v[e]);
    }
  }
}

// Normalises one row of K into `out`, returning 1 / sqrt(sum x^2 + eps).
template <int kVec, typename In>
__device__ __forceinline__ float NormaliseRow(const In* x, In* out, int kd, float eps, int lane) {
  float v[kMaxPerLane];
  LoadRow<kVec>(x, kd, lane, v);
  float ss = 0.0f;
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) ss += v[e] * v[e];
  const float r = rsqrtf(WarpSum(ss) + eps);
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) v[e] *= r;
  StoreRow<kVec>(out, kd, lane, v);
  return r;
}

template <int kVec, typename In, typename GIn>
__global__ void __launch_bounds__(kThreads)
    KdaTransformInputsKernel(TransformParams p, ForwardArgs<In, GIn> a) {
  const int h = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32, kd = p.kd;
  const float ea = p.tr.a_log != nullptr ? __expf(p.tr.a_log[h]) : 1.0f;
  const int64_t t_end = min(p.rows, static_cast<int64_t>(blockIdx.y + 1) * kTokens);
  for (int64_t t = static_cast<int64_t>(blockIdx.y) * kTokens + warp; t < t_end; t += kWarps) {
    const int64_t row = t * p.heads + h;
    if (p.tr.qk_l2norm) {
      const float rq = NormaliseRow<kVec>(a.q + row * kd, a.q_out + row * kd, kd, p.tr.eps, lane);
      const float rk = NormaliseRow<kVec>(a.k + row * kd, a.k_out + row * kd, kd, p.tr.eps, lane);
      if (lane == 0) {
        a.q_rstd[row] = rq;
        a.k_rstd[row] = rk;
      }
    }
    if (p.tr.beta_sigmoid && lane == 0) StoreF(a.beta_out + row, SigmoidF(LoadF(a.beta + row)));
    if (p.tr.gate) {
      float z[kMaxPerLane];
      LoadRow<kVec>(a.z + row * kd, kd, lane, z);
#pragma unroll
      for (int e = 0; e < kMaxPerLane; ++e) {
        const int d = Column<kVec>(e, lane);
        const float b = p.tr.dt_bias != nullptr && d < kd ? p.tr.dt_bias[h * kd + d] : 0.0f;
        z[e] = KdaGateValue(z[e] + b, ea, p.tr.bounded, p.tr.g_min);
      }
      StoreRow<kVec>(a.g_out + row * kd, kd, lane, z);
    }
  }
}

template <typename In, typename GIn>
struct ChainArgs {
  const In *q_hat, *k_hat, *beta_hat;  // the recurrence's inputs
  const GIn* z;                        // raw gate input
  const float *q_rstd, *k_rstd;
  In *dq, *dk, *dbeta;  // in place: w.r.t. the transformed inputs in, w.r.t. raw out
  const float* dg;      // w.r.t. the activated gate (f32)
  GIn* dz;
  // Or null: [blocks along the tokens, H] and [blocks along the tokens, H, K], each block's sums.
  float *da_log_parts, *ddt_bias_parts;
};

// dx <- rstd (dx - x_hat <x_hat, dx>) for one row, in place.
template <int kVec, typename In>
__device__ __forceinline__ void ChainRow(const In* x_hat, In* dx, float rstd, int kd, int lane) {
  float xv[kMaxPerLane], dv[kMaxPerLane];
  LoadRow<kVec>(x_hat, kd, lane, xv);
  LoadRow<kVec>(dx, kd, lane, dv);
  float dot = 0.0f;
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) dot += xv[e] * dv[e];
  dot = WarpSum(dot);
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) dv[e] = rstd * (dv[e] - xv[e] * dot);
  StoreRow<kVec>(dx, kd, lane, dv);
}

template <int kVec, typename In, typename GIn>
__global__ void __launch_bounds__(kThreads)
    KdaChainTransformsKernel(TransformParams p, ChainArgs<In, GIn> a) {
  __shared__ float db_part[kWarps][kMaxPerLane * 32];
  __shared__ float da_part[kWarps];
  const int h = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32, kd = p.kd;
  const float ea = p.tr.a_log != nullptr ? __expf(p.tr.a_log[h]) : 1.0f;
  float db[kMaxPerLane] = {}, da = 0.0f;
  const int64_t t_end = min(p.rows, static_cast<int64_t>(blockIdx.y + 1) * kTokens);
  for (int64_t t = static_cast<int64_t>(blockIdx.y) * kTokens + warp; t < t_end; t += kWarps) {
    const int64_t row = t * p.heads + h;
    if (p.tr.qk_l2norm) {
      ChainRow<kVec>(a.q_hat + row * kd, a.dq + row * kd, a.q_rstd[row], kd, lane);
      ChainRow<kVec>(a.k_hat + row * kd, a.dk + row * kd, a.k_rstd[row], kd, lane);
    }
    if (p.tr.beta_sigmoid && lane == 0) {
      const float b = LoadF(a.beta_hat + row);
      StoreF(a.dbeta + row, LoadF(a.dbeta + row) * b * (1.0f - b));
    }
    if (p.tr.gate) {
      float z[kMaxPerLane], dg[kMaxPerLane];
      LoadRow<kVec>(a.z + row * kd, kd, lane, z);
      LoadRow<kVec>(a.dg + row * kd, kd, lane, dg);
#pragma unroll
      for (int e = 0; e < kMaxPerLane; ++e) {
        const int d = Column<kVec>(e, lane);
        const float x =
            z[e] + (p.tr.dt_bias != nullptr && d < kd ? p.tr.dt_bias[h * kd + d] : 0.0f);
        float dx, dA;  // dg/dx and dg/dA_log
        KdaGateGrad(x, ea, p.tr.bounded, p.tr.g_min, &dx, &dA);
        z[e] = dg[e] * dx;  // dz (zero past the row's end: dg is)
        db[e] += z[e];
        da += dg[e] * dA;
      }
      StoreRow<kVec>(a.dz + row * kd, kd, lane, z);
    }
  }
  if (!p.tr.gate || (a.da_log_parts == nullptr && a.ddt_bias_parts == nullptr)) return;
    // The block's sums: over the lanes' tokens (registers), then the warps in order (shared
    // memory), into the block's slots.
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) db_part[warp][Column<kVec>(e, lane)] = db[e];
  da = WarpSum(da);
  if (lane == 0) da_part[warp] = da;
  __syncthreads();
  const int64_t slot = static_cast<int64_t>(blockIdx.y) * p.heads + h;
  if (a.ddt_bias_parts != nullptr) {
    for (int d = threadIdx.x; d < kd; d += kThreads) {
      float sum = 0.0f;
      for (int w = 0; w < kWarps; ++w) sum += db_part[w][d];
      a.ddt_bias_parts[slot * kd + d] = sum;
    }
  }
  if (a.da_log_parts != nullptr && threadIdx.x == 0) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) sum += da_part[w];
    a.da_log_parts[slot] = sum;
  }
}

TransformParams Params(const KdaProblem& p, const KdaInputs& raw, const KdaInputTransforms& t) {
  TransformParams tp;
  tp.rows = p.batch * p.tokens;
  tp.heads = static_cast<int>(p.heads);
  tp.kd = static_cast<int>(p.key_dim);
  tp.tr = MakeChunkInputTransforms(t, raw);
  return tp;
}

dim3 Grid(const KdaProblem& p) {
  return dim3(static_cast<unsigned>(p.heads),
              static_cast<unsigned>((p.batch * p.tokens + kTokens - 1) / kTokens));
}

// Whether rows of K can move in 4-element pieces: K % 4 == 0 and every (defined) base 16-byte
// aligned.
bool Vectorised(const KdaProblem& p, std::initializer_list<const Tensor*> tensors) {
  if (p.key_dim % 4 != 0) return false;
  for (const Tensor* t : tensors) {
    if (t->defined() && reinterpret_cast<uintptr_t>(t->raw_data()) % 16 != 0) return false;
  }
  return true;
}

template <typename T>
T* Ptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(const_cast<void*>(t.raw_data())) : nullptr;
}

template <typename In, typename GIn>
Status TransformInputs(const KdaProblem& p, const KdaInputs& raw, const KdaInputTransforms& t,
                       KdaInputs* out, Tensor* q_rstd, Tensor* k_rstd) {
  const Device dev = p.device;
  const Shape rows = {p.batch, p.tokens, p.heads};
  if (t.qk_l2norm) {
    ORRERY_ASSIGN_OR_RETURN(out->q, Tensor::Allocate(raw.q.shape(), raw.q.dtype(), dev));
    ORRERY_ASSIGN_OR_RETURN(out->k, Tensor::Allocate(raw.k.shape(), raw.k.dtype(), dev));
    ORRERY_ASSIGN_OR_RETURN(*q_rstd, Tensor::Allocate(rows, DType::kF32, dev));
    ORRERY_ASSIGN_OR_RETURN(*k_rstd, Tensor::Allocate(rows, DType::kF32, dev));
  }
  if (t.beta_sigmoid) {
    ORRERY_ASSIGN_OR_RETURN(out->beta, Tensor::Allocate(raw.beta.shape(), raw.beta.dtype(), dev));
  }
  if (t.gate) {
    ORRERY_ASSIGN_OR_RETURN(out->g, Tensor::Allocate(raw.g.shape(), DType::kF32, dev));
  }
  ForwardArgs<In, GIn> a{Ptr<const In>(raw.q),  Ptr<const In>(raw.k), Ptr<const In>(raw.beta),
                         Ptr<const GIn>(raw.g), Ptr<In>(out->q),      Ptr<In>(out->k),
                         Ptr<In>(out->beta),    Ptr<float>(out->g),   Ptr<float>(*q_rstd),
                         Ptr<float>(*k_rstd)};
  if (p.batch * p.tokens > 0) {
    if (Vectorised(p, {&raw.q, &raw.k, &raw.g, &out->q, &out->k, &out->g})) {
      KdaTransformInputsKernel<4, In, GIn><<<Grid(p), kThreads>>>(Params(p, raw, t), a);
    } else {
      KdaTransformInputsKernel<1, In, GIn><<<Grid(p), kThreads>>>(Params(p, raw, t), a);
    }
    ORRERY_RETURN_IF_ERROR(CudaCheck(cudaGetLastError(), "input transforms launch"));
  }
  return Status::OK();
}

template <typename In, typename GIn>
Status ChainTransforms(const KdaProblem& p, const KdaInputs& raw, const KdaInputs& x,
                       const Tensor& q_rstd, const Tensor& k_rstd, const KdaInputTransforms& t,
                       KdaGrads* grads) {
  const Device dev = p.device;
  const int64_t blocks = Grid(p).y;
  Tensor dz, da_log_parts, ddt_bias_parts;
  if (t.gate) {
    ORRERY_ASSIGN_OR_RETURN(dz, Tensor::Allocate(raw.g.shape(), raw.g.dtype(), dev));
    ORRERY_RETURN_IF_ERROR(AllocateGateParamGrads(raw, dev, grads));
    if (grads->da_log.defined()) {
      ORRERY_ASSIGN_OR_RETURN(da_log_parts, Tensor::Allocate({blocks, p.heads}, DType::kF32, dev));
    }
    if (grads->ddt_bias.defined()) {
      ORRERY_ASSIGN_OR_RETURN(ddt_bias_parts,
                              Tensor::Allocate({blocks, p.heads * p.key_dim}, DType::kF32, dev));
    }
  }
  ChainArgs<In, GIn> a{Ptr<const In>(x.q),
                       Ptr<const In>(x.k),
                       Ptr<const In>(x.beta),
                       Ptr<const GIn>(raw.g),
                       Ptr<const float>(q_rstd),
                       Ptr<const float>(k_rstd),
                       Ptr<In>(grads->dq),
                       Ptr<In>(grads->dk),
                       Ptr<In>(grads->dbeta),
                       Ptr<const float>(grads->dg),
                       Ptr<GIn>(dz),
                       Ptr<float>(da_log_parts),
                       Ptr<float>(ddt_bias_parts)};
  if (p.batch * p.tokens > 0) {
    if (Vectorised(p, {&x.q, &x.k, &raw.g, &grads->dq, &grads->dk, &grads->dg, &dz})) {
      KdaChainTransformsKernel<4, In, GIn><<<Grid(p), kThreads>>>(Params(p, raw, t), a);
    } else {
      KdaChainTransformsKernel<1, In, GIn><<<Grid(p), kThreads>>>(Params(p, raw, t), a);
    }
    ORRERY_RETURN_IF_ERROR(CudaCheck(cudaGetLastError(), "input transforms backward launch"));
  }
  if (p.batch * p.tokens > 0) {
    ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(dev.index));
    if (da_log_parts.defined()) {
      ORRERY_RETURN_IF_ERROR(LaunchColumnSums(da_log_parts.data<float>(), blocks, p.heads, true,
                                              grads->da_log.data<float>(), ctx->stream()));
    }
    if (ddt_bias_parts.defined()) {
      ORRERY_RETURN_IF_ERROR(LaunchColumnSums(ddt_bias_parts.data<float>(), blocks,
                                              p.heads * p.key_dim, true,
                                              grads->ddt_bias.data<float>(), ctx->stream()));
    }
  }
  if (t.gate) grads->dg = dz;
  // dz and the kernel's reads of the transformed inputs outlive this call only through the
  // tensors it returns; wait so that freed scratch is not handed out under the kernel.
  return CudaCheck(cudaDeviceSynchronize(), "input transforms backward");
}

}  // namespace

Status AllocateGateParamGrads(const KdaInputs& raw, Device dev, KdaGrads* grads) {
  // Zeroed on the stream the fixed-order sums that add into them are queued on.
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(dev.index));
  for (const auto& [param, grad] :
       {std::pair<const Tensor*, Tensor*>{&raw.a_log, &grads->da_log},
        std::pair<const Tensor*, Tensor*>{&raw.dt_bias, &grads->ddt_bias}}) {
    if (!param->defined()) continue;
    ORRERY_ASSIGN_OR_RETURN(*grad, Tensor::Allocate(param->shape(), DType::kF32, dev));
    ORRERY_RETURN_IF_ERROR(CudaCheck(
        cudaMemsetAsync(grad->raw_data(), 0, grad->nbytes(), ctx->stream()), "cudaMemsetAsync"));
  }
  return Status::OK();
}

Status KdaTransformInputsCuda(const KdaProblem& p, const KdaInputs& raw,
                              const KdaInputTransforms& t, KdaInputs* out, Tensor* q_rstd,
                              Tensor* k_rstd) {
  const bool bf16 = p.dtype == DType::kBF16, g_bf16 = raw.g.dtype() == DType::kBF16;
  if (bf16) {
    return g_bf16 ? TransformInputs<__nv_bfloat16, __nv_bfloat16>(p, raw, t, out, q_rstd, k_rstd)
                  : TransformInputs<__nv_bfloat16, float>(p, raw, t, out, q_rstd, k_rstd);
  }
  return TransformInputs<float, float>(p, raw, t, out, q_rstd, k_rstd);
}

Status KdaChainTransformsCuda(const KdaProblem& p, const KdaInputs& raw,
                              const KdaInputs& transformed, const Tensor& q_rstd,
                              const Tensor& k_rstd, const KdaInputTransforms& t, KdaGrads* grads) {
  if (t.gate && grads->dg.dtype() != DType::kF32) {
    return InternalError("kda cuda: the activated gate's gradient is " + grads->dg.ToString() +
                         ", expected f32");
  }
  const bool bf16 = p.dtype == DType::kBF16, g_bf16 = raw.g.dtype() == DType::kBF16;
  if (bf16) {
    return g_bf16 ? ChainTransforms<__nv_bfloat16, __nv_bfloat16>(p, raw, transformed, q_rstd,
                                                                  k_rstd, t, grads)
                  : ChainTransforms<__nv_bfloat16, float>(p, raw, transformed, q_rstd, k_rstd, t,
                                                          grads);
  }
  return ChainTransforms<float, float>(p, raw, transformed, q_rstd, k_rstd, t, grads);
}

}  // namespace orrery::kernels::cuda
