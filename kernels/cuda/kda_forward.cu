// KDA chunked forward on the GPU (spec §2.4), 16-token chunks, fp32 arithmetic.
//
// One thread block per (sequence, head, 32-wide slice of V). The block keeps its K x 32 slice of
// the state in shared memory in fp32 and walks the sequence's chunks in order; per chunk it forms
// the cumulative decay, the pairwise A_qk / A_kk with exponents e^{G_r - G_j} <= 1 (exact for the
// bounded and the original gate), the unit-triangular inverse by forward substitution in one warp,
// W, U, the pseudo-values Vnew = U - W S, the output and the state update. W and the A matrices
// are recomputed by each V-slice of a head (a 4x redundancy at V = 128) so that a head spreads
// over several blocks. This is the first, SIMT version: no tensor-core MMAs yet (docs/kda.md).
#include <cuda_bf16.h>

#include <vector>

#include "kernels/cuda/kda_cuda.h"
#include "kernels/cuda/kda_cuda_util.cuh"

namespace orrery::kernels::cuda {
namespace {

constexpr int kChunk = 16;
constexpr int kSliceV = 32;
constexpr int kThreads = 256;

template <typename In, typename GIn>
struct ForwardParams {
  const In *q, *k, *v, *beta;
  const GIn* g;
  const int64_t* seq_start;  // [N + 1] flattened token rows
  const float* h0;           // [N, H, K, V] or null
  float* ht;                 // [N, H, K, V] or null
  In* o;                     // [rows, H, V] or null (the backward's sweep needs no output)
  // For the backward (null otherwise): the state at every chunk start, [chunks, H, K, V] with
  // sequence n's chunks from chunk_first[n], and the pseudo-values Vnew [rows, H, V].
  const int64_t* chunk_first;
  float* chunk_states;
  float* vnew;
  int heads, kd, vd;
  float scale;
};

size_t ForwardSharedBytes(int kd) {
  const size_t floats = static_cast<size_t>(kd) * kSliceV + 6 * kChunk * kd + 2 * kChunk * kSliceV +
                        3 * kChunk * kChunk + kChunk + kd;
  return floats * sizeof(float);
}

template <typename In, typename GIn>
__global__ void __launch_bounds__(kThreads) KdaForwardKernel(ForwardParams<In, GIn> p) {
  extern __shared__ float smem[];
  const int kd = p.kd, vd = p.vd, heads = p.heads;
  const int n = blockIdx.x / heads, h = blockIdx.x % heads;
  const int v0 = blockIdx.y * kSliceV;
  const int bv = min(kSliceV, vd - v0);
  const int tid = threadIdx.x;
  float* S = smem;                     // [kd][kSliceV]
  float* qs = S + kd * kSliceV;        // q, then q e^G     [C][kd]
  float* ks = qs + kChunk * kd;        // k                 [C][kd]
  float* Gs = ks + kChunk * kd;        // g, then cumsum    [C][kd]
  float* bk = Gs + kChunk * kd;        // beta k e^G        [C][kd]
  float* kb = bk + kChunk * kd;        // k e^{Gc - G}      [C][kd]
  float* ws = kb + kChunk * kd;        // W                 [C][kd]
  float* vs = ws + kChunk * kd;        // v, then beta v    [C][kSliceV]
  float* us = vs + kChunk * kSliceV;   // U, then Vnew      [C][kSliceV]
  float* aqk = us + kChunk * kSliceV;  // [C][C]
  float* akk = aqk + kChunk * kChunk;  // [C][C]
  float* tm = akk + kChunk * kChunk;   // [C][C]
  float* bs = tm + kChunk * kChunk;    // beta [C]
  float* egc = bs + kChunk;            // e^{Gc} [kd]

  const int64_t bos = p.seq_start[n], len = p.seq_start[n + 1] - bos;
  const int64_t state_off = (static_cast<int64_t>(n) * heads + h) * kd * vd;
  for (int i = tid; i < kd * kSliceV; i += kThreads) {
    const int d = i / kSliceV, j = i % kSliceV;
    S[i] = (p.h0 != nullptr && j < bv) ? p.h0[state_off + d * vd + v0 + j] : 0.0f;
  }
  __syncthreads();
  for (int64_t t0 = 0; t0 < len; t0 += kChunk) {
    const int c = len - t0 < kChunk ? static_cast<int>(len - t0) : kChunk;
    if (p.chunk_states != nullptr) {
      float* dst = p.chunk_states + ((p.chunk_first[n] + t0 / kChunk) * heads + h) * kd * vd;
      for (int i = tid; i < kd * kSliceV; i += kThreads) {
        const int d = i / kSliceV, j = i % kSliceV;
        if (j < bv) dst[d * vd + v0 + j] = S[i];
      }
    }
    // 1. Load the chunk.
    for (int i = tid; i < c * kd; i += kThreads) {
      const int r = i / kd, d = i % kd;
      const int64_t off = ((bos + t0 + r) * heads + h) * kd + d;
      qs[i] = LoadF(p.q + off);
      ks[i] = LoadF(p.k + off);
      Gs[i] = LoadF(p.g + off);
    }
    for (int i = tid; i < c * kSliceV; i += kThreads) {
      const int r = i / kSliceV, j = i % kSliceV;
      vs[i] = j < bv ? LoadF(p.v + ((bos + t0 + r) * heads + h) * vd + v0 + j) : 0.0f;
    }
    if (tid < c) bs[tid] = LoadF(p.beta + (bos + t0 + tid) * heads + h);
    __syncthreads();
    // 2. Chunk-local cumulative decay.
    for (int d = tid; d < kd; d += kThreads) {
      float acc = 0.0f;
      for (int r = 0; r < c; ++r) {
        acc += Gs[r * kd + d];
        Gs[r * kd + d] = acc;
      }
      egc[d] = __expf(acc);
    }
    __syncthreads();
    // 3. Pairwise A_qk, A_kk; element-wise beta k e^G and k e^{Gc - G}.
    for (int i = tid; i < kChunk * kChunk; i += kThreads) {
      const int r = i / kChunk, j = i % kChunk;
      float sq = 0.0f, sk = 0.0f;
      if (r < c && j <= r) {
        for (int d = 0; d < kd; ++d) {
          const float kk = ks[j * kd + d] * __expf(Gs[r * kd + d] - Gs[j * kd + d]);
          sq += qs[r * kd + d] * kk;
          sk += ks[r * kd + d] * kk;
        }
      }
      aqk[i] = p.scale * sq;
      akk[i] = (r < c && j < r) ? bs[r] * sk : 0.0f;
    }
    for (int i = tid; i < c * kd; i += kThreads) {
      const int r = i / kd, d = i % kd;
      const float gc = Gs[(c - 1) * kd + d];
      bk[i] = bs[r] * ks[i] * __expf(Gs[i]);
      kb[i] = ks[i] * __expf(gc - Gs[i]);
    }
    __syncthreads();
    // 4. Tm = (I + A_kk)^-1 in warp 0 (row by row); q e^G and beta v elsewhere.
    if (tid < 32) {
      const int j = tid;
      for (int r = 0; r < kChunk; ++r) {
        if (j < kChunk) {
          float val = j == r ? 1.0f : 0.0f;
          if (j < r) {
            float acc = 0.0f;
            for (int i = j; i < r; ++i) acc += akk[r * kChunk + i] * tm[i * kChunk + j];
            val = -acc;
          }
          tm[r * kChunk + j] = val;
        }
        __syncwarp();
      }
    } else {
      for (int i = tid - 32; i < c * kd; i += kThreads - 32) qs[i] *= __expf(Gs[i]);
      for (int i = tid - 32; i < c * kSliceV; i += kThreads - 32) vs[i] *= bs[i / kSliceV];
    }
    __syncthreads();
    // 5. W = Tm (beta k e^G), U = Tm (beta v).
    for (int i = tid; i < c * kd; i += kThreads) {
      const int r = i / kd, d = i % kd;
      float acc = 0.0f;
      for (int m = 0; m <= r; ++m) acc += tm[r * kChunk + m] * bk[m * kd + d];
      ws[i] = acc;
    }
    for (int i = tid; i < c * kSliceV; i += kThreads) {
      const int r = i / kSliceV, j = i % kSliceV;
      float acc = 0.0f;
      for (int m = 0; m <= r; ++m) acc += tm[r * kChunk + m] * vs[m * kSliceV + j];
      us[i] = acc;
    }
    __syncthreads();
    // 6. Vnew = U - W S.
    for (int i = tid; i < c * kSliceV; i += kThreads) {
      const int r = i / kSliceV, j = i % kSliceV;
      float acc = 0.0f;
      for (int d = 0; d < kd; ++d) acc += ws[r * kd + d] * S[d * kSliceV + j];
      us[i] -= acc;
      if (p.vnew != nullptr && j < bv && r < c)
        p.vnew[((bos + t0 + r) * heads + h) * vd + v0 + j] = us[i];
    }
    __syncthreads();
    // 7. O = scale (q e^G) S + A_qk Vnew.
    for (int i = tid; p.o != nullptr && i < c * kSliceV; i += kThreads) {
      const int r = i / kSliceV, j = i % kSliceV;
      if (j >= bv) continue;
      float acc = 0.0f;
      for (int d = 0; d < kd; ++d) acc += qs[r * kd + d] * S[d * kSliceV + j];
      acc *= p.scale;
      for (int m = 0; m <= r; ++m) acc += aqk[r * kChunk + m] * us[m * kSliceV + j];
      StoreF(p.o + ((bos + t0 + r) * heads + h) * vd + v0 + j, acc);
    }
    __syncthreads();
    // 8. S <- Diag(e^{Gc}) S + (k e^{Gc - G})^T Vnew.
    for (int i = tid; i < kd * kSliceV; i += kThreads) {
      const int d = i / kSliceV, j = i % kSliceV;
      float acc = egc[d] * S[i];
      for (int r = 0; r < c; ++r) acc += kb[r * kd + d] * us[r * kSliceV + j];
      S[i] = acc;
    }
    __syncthreads();
  }
  if (p.ht != nullptr) {
    for (int i = tid; i < kd * kSliceV; i += kThreads) {
      const int d = i / kSliceV, j = i % kSliceV;
      if (j < bv) p.ht[state_off + d * vd + v0 + j] = S[i];
    }
  }
}

template <typename In, typename GIn>
Status Launch(const KdaProblem& p, const KdaInputs& in, const int64_t* seq_start, KdaOutputs* out,
              const KdaForwardSweep& sweep) {
  ForwardParams<In, GIn> params;
  params.q = static_cast<const In*>(in.q.raw_data());
  params.k = static_cast<const In*>(in.k.raw_data());
  params.v = static_cast<const In*>(in.v.raw_data());
  params.beta = static_cast<const In*>(in.beta.raw_data());
  params.g = static_cast<const GIn*>(in.g.raw_data());
  params.seq_start = seq_start;
  params.h0 = in.initial_state.defined() ? in.initial_state.data<float>() : nullptr;
  params.ht = out->final_state.defined() ? out->final_state.data<float>() : nullptr;
  params.o = out->o.defined() ? static_cast<In*>(out->o.raw_data()) : nullptr;
  params.chunk_first = sweep.chunk_first;
  params.chunk_states = sweep.chunk_states;
  params.vnew = sweep.vnew;
  params.heads = static_cast<int>(p.heads);
  params.kd = static_cast<int>(p.key_dim);
  params.vd = static_cast<int>(p.value_dim);
  params.scale = p.scale;
  const size_t smem = ForwardSharedBytes(params.kd);
  ORRERY_RETURN_IF_ERROR(CudaCheck(
      cudaFuncSetAttribute(KdaForwardKernel<In, GIn>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)),
      "cudaFuncSetAttribute"));
  const dim3 grid(static_cast<unsigned>(p.num_sequences() * p.heads),
                  static_cast<unsigned>((p.value_dim + kSliceV - 1) / kSliceV));
  ORRERY_ASSIGN_OR_RETURN(const cudaStream_t stream, StreamOf(p.device));
  KdaForwardKernel<In, GIn><<<grid, kThreads, smem, stream>>>(params);
  return CudaCheck(cudaGetLastError(), "forward kernel launch");
}

}  // namespace

Status CheckCudaKdaSupported(const KdaProblem& p, const KdaInputs& in) {
  if (p.key_dim > 128) {
    return UnimplementedError("kda cuda: K = " + std::to_string(p.key_dim) +
                              ", the CUDA kernels support K <= 128 (the state slice lives in "
                              "shared memory)");
  }
  if (in.initial_state.defined() && in.initial_state.dtype() != DType::kF32) {
    return InvalidArgumentError("kda cuda: initial_state " + in.initial_state.ToString() +
                                ", expected f32");
  }
  return Status::OK();
}

Status LaunchKdaForward(const KdaProblem& p, const KdaInputs& in, const int64_t* seq_start,
                        KdaOutputs* out, const KdaForwardSweep& sweep) {
  if (p.dtype == DType::kBF16 && in.g.dtype() == DType::kF32) {
    return Launch<__nv_bfloat16, float>(p, in, seq_start, out, sweep);
  }
  if (p.dtype == DType::kBF16)
    return Launch<__nv_bfloat16, __nv_bfloat16>(p, in, seq_start, out, sweep);
  return Launch<float, float>(p, in, seq_start, out, sweep);
}

Status KdaForwardCuda(const KdaProblem& p, const KdaInputs& in, bool output_final_state,
                      KdaOutputs* out, KdaTcSaved* keep, const KdaInputTransforms* fused) {
  ORRERY_RETURN_IF_ERROR(CheckCudaKdaSupported(p, in));
  ORRERY_ASSIGN_OR_RETURN(out->o, Tensor::Allocate(in.v.shape(), in.v.dtype(), p.device));
  out->final_state = Tensor();
  if (output_final_state) {
    ORRERY_ASSIGN_OR_RETURN(out->final_state,
                            Tensor::Allocate({p.num_sequences(), p.heads, p.key_dim, p.value_dim},
                                             DType::kF32, p.device));
  }
  if (KdaTcSupported(p, in)) return LaunchKdaForwardTc(p, in, KdaTcTuning(), out, keep, fused);
  if (fused != nullptr) {
    return InternalError("kda cuda: input transforms fused into a forward without tensor cores");
  }
  Tensor starts = Tensor::FromVector<int64_t>({p.num_sequences() + 1}, p.seq_start);
  ORRERY_ASSIGN_OR_RETURN(Tensor starts_dev, starts.To(p.device));
  // starts_dev goes back to the block cache when this returns: whatever takes it next is queued
  // after the kernel on the same stream.
  return LaunchKdaForward(p, in, starts_dev.data<int64_t>(), out, KdaForwardSweep());
}

}  // namespace orrery::kernels::cuda
