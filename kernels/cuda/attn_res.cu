// Block AttnRes mixing forward and backward (kernels/attn_res.h): every sum, the scores and the
// softmax in f32 (spec §6.4), precise expf. The source (and source-gradient) pointers travel by
// value as one __grid_constant__ argument of kAttnResMaxSourcesCuda entries (1 KB each, within
// the 4 KB of kernel parameters).
//
// Forward, one warp per token row, grid-stride over rows: pass 1 reads each source's d elements
// once for its mean square and its dot with u = gamma w (the score), the warp's n scores go to
// shared memory, the softmax is taken there; pass 2 reads the sources again for h = sum_i p_i v_i.
// Backward, in rounds of kWarps x rows_per_warp rows: pass 1, a warp per row, reads each source
// once with dh for dp_i = <dh, v_i>, r_i and <k_i, u>, and leaves the row's per-source
// coefficients in shared memory; pass 2 runs the block over the round by columns: the block's du
// partial is [groups][d] slots (groups = kThreads / d for rows narrower than the block, else 1),
// each owned by one thread, which reads the sources again at its column for rows group,
// group + groups, ... of the round, adds into each d_source (one thread per (row, element)
// read-modify-write, so no atomics, and entries that alias one buffer are still summed
// correctly) and adds the rows' du = sum_i ds_i r_i v_i to its slot in row order. The block's
// groups, summed in order, go to its row of a [blocks, d] scratch; LaunchColumnSums
// (column_sums.h) sums those rows in an order fixed by the shape, and a last pass adds
// du gamma to dw and du w to dgamma. No float atomics: the same inputs give the same bits on
// every run (the atomic version's last bits depended on the order of blocks).
// Not yet timed alone; in the profile of bench-1b at 4 x 4K the atomic version's backward took
// 24 ms of a 352 ms step (docs/benchmarks.md). Fusing with the next RMSNorm (spec §6.4) comes
// with the profile.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/column_sums.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kMaxSources = kAttnResMaxSourcesCuda;
constexpr size_t kSharedBytes = 48 * 1024;  // the default limit of a block's shared memory
// The backward's rounds: about this many elements each (a round of 8 rows of 1536 has 12K).
constexpr int64_t kRoundElements = 4096;
constexpr int kMaxRowsPerWarp = 8;

struct SourcePtrs {
  const void* v[kMaxSources];
};
struct GradPtrs {
  float* v[kMaxSources];
};

template <typename T>
__device__ __forceinline__ const T* Row(const SourcePtrs& s, int i, int64_t r, int64_t d) {
  return static_cast<const T*>(s.v[i]) + r * d;
}

// Shared memory: the warps' probabilities, [kWarps][n].
template <typename T>
__global__ void AttnResMixKernel(const __grid_constant__ SourcePtrs src, int n, int64_t rows,
                                 int64_t d, const T* __restrict__ w, const T* __restrict__ gamma,
                                 float eps, T* __restrict__ h, float* __restrict__ p) {
  extern __shared__ float smem[];
  const int lane = threadIdx.x % 32;
  float* pr = smem + (threadIdx.x / 32) * n;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    // Every lane ends with the same warp sums (xor butterfly), so m is uniform across the warp.
    float m = -INFINITY;
    for (int i = 0; i < n; ++i) {
      const T* v = Row<T>(src, i, r, d);
      float ss = 0.0f, dot = 0.0f;
      for (int64_t c = lane; c < d; c += 32) {
        const float x = ToF(v[c]);
        ss += x * x;
        dot += x * (ToF(gamma[c]) * ToF(w[c]));
      }
      const float score = WarpSum(dot) * rsqrtf(WarpSum(ss) / static_cast<float>(d) + eps);
      if (lane == 0) pr[i] = score;
      m = fmaxf(m, score);
    }
    __syncwarp();
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) sum += expf(pr[i] - m);
    __syncwarp();
    for (int i = lane; i < n; i += 32) {
      pr[i] = expf(pr[i] - m) / sum;
      if (p != nullptr) p[r * n + i] = pr[i];
    }
    __syncwarp();
    T* hr = h + r * d;
    for (int64_t c = lane; c < d; c += 32) {
      float acc = 0.0f;
      for (int i = 0; i < n; ++i) acc += pr[i] * ToF(Row<T>(src, i, r, d)[c]);
      hr[c] = FromF<T>(acc);
    }
    __syncwarp();  // pr is rewritten for the next row
  }
}

// Shared memory: [3][round rows][n] per-source coefficients, then the block's [groups][d] du
// slots when du_shared (else groups == 1 and the slots are its du_parts row).
template <typename T>
__global__ void AttnResMixGradKernel(const __grid_constant__ SourcePtrs src,
                                     const __grid_constant__ GradPtrs dsrc, int n, int64_t rows,
                                     int64_t d, int rows_per_warp, int groups,
                                     const T* __restrict__ w, const T* __restrict__ gamma,
                                     float eps, const float* __restrict__ p,
                                     const T* __restrict__ dh, float* __restrict__ du_parts,
                                     bool du_shared) {
  extern __shared__ float smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int round_rows = kWarps * rows_per_warp;
  // Pass 1 leaves dp_i, r_i, <k_i, u> of round row li in a, b, q [li][i]; then a = coef_i =
  // ds_i r_i, b = e_i = coef_i r_i <k_i, u> / d, q = p_i, the terms of
  // dv_i = p_i dh + coef_i u - e_i v_i and du += coef_i v_i.
  float* a = smem;
  float* b = smem + round_rows * n;
  float* q = smem + 2 * round_rows * n;
  float* slot =
      du_shared ? smem + 3 * round_rows * n : du_parts + static_cast<int64_t>(blockIdx.x) * d;
  const int64_t slots = groups * d;
  for (int64_t i = threadIdx.x; i < slots; i += kThreads) slot[i] = 0.0f;
  const float inv_d = 1.0f / static_cast<float>(d);
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * round_rows; base < rows;
       base += static_cast<int64_t>(gridDim.x) * round_rows) {
    // Pass 1: a warp per row.
    for (int j = 0; j < rows_per_warp; ++j) {
      const int li = warp * rows_per_warp + j;
      const int64_t r = base + li;
      if (r >= rows) break;  // uniform across the warp
      float* ar = a + li * n;
      float* br = b + li * n;
      float* qr = q + li * n;
      const T* dhr = dh + r * d;
      const float* pr = p + r * n;
      float pdp = 0.0f;  // sum_j p_j dp_j, uniform across the warp
      for (int i = 0; i < n; ++i) {
        const T* v = Row<T>(src, i, r, d);
        float dp = 0.0f, vu = 0.0f, ss = 0.0f;
        for (int64_t c = lane; c < d; c += 32) {
          const float x = ToF(v[c]);
          dp += ToF(dhr[c]) * x;
          vu += x * (ToF(gamma[c]) * ToF(w[c]));
          ss += x * x;
        }
        dp = WarpSum(dp);
        const float rs = rsqrtf(WarpSum(ss) * inv_d + eps);
        vu = WarpSum(vu);
        if (lane == 0) {
          ar[i] = dp;
          br[i] = rs;
          qr[i] = vu * rs;
        }
        pdp += pr[i] * dp;
      }
      __syncwarp();
      for (int i = lane; i < n; i += 32) {
        const float coef = pr[i] * (ar[i] - pdp) * br[i];
        const float e = coef * br[i] * qr[i] * inv_d;
        ar[i] = coef;
        br[i] = e;
        qr[i] = pr[i];
      }
    }
    __syncthreads();
    // Pass 2: the block by (group, column) slots.
    for (int64_t s = threadIdx.x; s < slots; s += kThreads) {
      const int group = static_cast<int>(s / d);
      const int64_t c = s % d;
      const float uc = ToF(gamma[c]) * ToF(w[c]);
      float acc = 0.0f;
#pragma unroll 2
      for (int li = group; li < round_rows && base + li < rows; li += groups) {
        const int64_t r = base + li;
        const float g = ToF(dh[r * d + c]);
        const float* ar = a + li * n;
        const float* br = b + li * n;
        const float* qr = q + li * n;
        float du = 0.0f;
        for (int i = 0; i < n; ++i) {
          const float x = ToF(Row<T>(src, i, r, d)[c]);
          du += ar[i] * x;
          if (dsrc.v[i] != nullptr) dsrc.v[i][r * d + c] += qr[i] * g + ar[i] * uc - br[i] * x;
        }
        acc += du;
      }
      slot[s] += acc;
    }
    __syncthreads();  // the coefficients are rewritten by the next round
  }
  if (du_shared) {
    for (int64_t c = threadIdx.x; c < d; c += kThreads) {
      float s = slot[c];
      for (int group = 1; group < groups; ++group) s += slot[group * d + c];
      du_parts[static_cast<int64_t>(blockIdx.x) * d + c] = s;
    }
  }
}

// dw += du gamma, dgamma += du w, one thread per element.
template <typename T>
__global__ void AttnResParamGradKernel(const float* __restrict__ du, const T* __restrict__ w,
                                       const T* __restrict__ gamma, int64_t d,
                                       float* __restrict__ dw, float* __restrict__ dgamma) {
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < d;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dw[c] += du[c] * ToF(gamma[c]);
    dgamma[c] += du[c] * ToF(w[c]);
  }
}

SourcePtrs PointersOf(const std::vector<Tensor>& sources) {
  SourcePtrs s{};
  for (size_t i = 0; i < sources.size(); ++i) s.v[i] = sources[i].raw_data();
  return s;
}

template <typename T>
const T* In(const Tensor& t) {
  return static_cast<const T*>(t.raw_data());
}

template <typename T>
Status Mix(const std::vector<Tensor>& sources, const Tensor& w, const Tensor& gamma, double eps,
           Tensor* h, Tensor* p, cudaStream_t s) {
  const int n = static_cast<int>(sources.size());
  const int64_t rows = sources[0].dim(0), d = sources[0].dim(1);
  const size_t smem = sizeof(float) * kWarps * n;
  AttnResMixKernel<T><<<GridFor(rows, kWarps), kThreads, smem, s>>>(
      PointersOf(sources), n, rows, d, In<T>(w), In<T>(gamma), static_cast<float>(eps),
      static_cast<T*>(h->raw_data()), p != nullptr ? p->data<float>() : nullptr);
  return LastLaunchStatus("AttnResMixKernel");
}

template <typename T>
Status MixGrad(const std::vector<Tensor>& sources, const Tensor& w, const Tensor& gamma, double eps,
               const Tensor& p, const Tensor& dh, const std::vector<Tensor>& d_sources, Tensor* dw,
               Tensor* dgamma, cudaStream_t s) {
  const int n = static_cast<int>(sources.size());
  const int64_t rows = sources[0].dim(0), d = sources[0].dim(1);
  GradPtrs g{};
  for (int i = 0; i < n; ++i)
    g.v[i] = d_sources[i].defined() ? d_sources[i].data<float>() : nullptr;
  // Rounds of about kRoundElements elements, their coefficients within half the shared memory.
  const int64_t coef_row_bytes = sizeof(float) * 3 * kWarps * n;
  const int rows_per_warp = static_cast<int>(
      std::clamp<int64_t>(std::min((kRoundElements + kWarps * d - 1) / (kWarps * d),
                                   static_cast<int64_t>(kSharedBytes / 2) / coef_row_bytes),
                          1, kMaxRowsPerWarp));
  const int round_rows = kWarps * rows_per_warp;
  const int groups = d >= kThreads ? 1 : static_cast<int>(kThreads / d);
  const unsigned grid = GridFor(rows, round_rows);
  const size_t coef_bytes = coef_row_bytes * rows_per_warp;
  const size_t slot_bytes = sizeof(float) * static_cast<size_t>(groups * d);
  // Rows too wide for the slots beside the coefficients take their block's row of the scratch as
  // the slots (groups is 1 there).
  const bool du_shared = coef_bytes + slot_bytes <= kSharedBytes;
  const Device dev = w.device();
  ORRERY_ASSIGN_OR_RETURN(Tensor parts, Tensor::Allocate({grid, d}, DType::kF32, dev));
  ORRERY_ASSIGN_OR_RETURN(Tensor du, Tensor::Allocate({d}, DType::kF32, dev));
  AttnResMixGradKernel<T><<<grid, kThreads, coef_bytes + (du_shared ? slot_bytes : 0), s>>>(
      PointersOf(sources), g, n, rows, d, rows_per_warp, groups, In<T>(w), In<T>(gamma),
      static_cast<float>(eps), p.data<float>(), In<T>(dh), parts.data<float>(), du_shared);
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("AttnResMixGradKernel"));
  ORRERY_RETURN_IF_ERROR(
      LaunchColumnSums(parts.data<float>(), grid, d, false, du.data<float>(), s));
  AttnResParamGradKernel<T><<<GridFor(d, kThreads), kThreads, 0, s>>>(
      du.data<float>(), In<T>(w), In<T>(gamma), d, dw->data<float>(), dgamma->data<float>());
  return LastLaunchStatus("AttnResParamGradKernel");
}

}  // namespace

Status AttnResMixCuda(const std::vector<Tensor>& sources, const Tensor& w, const Tensor& gamma,
                      double eps, Tensor* h, Tensor* p) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(w.device().index));
  if (w.dtype() == DType::kBF16) {
    return Mix<__nv_bfloat16>(sources, w, gamma, eps, h, p, ctx->stream());
  }
  return Mix<float>(sources, w, gamma, eps, h, p, ctx->stream());
}

Status AttnResMixGradCuda(const std::vector<Tensor>& sources, const Tensor& w, const Tensor& gamma,
                          double eps, const Tensor& p, const Tensor& dh,
                          const std::vector<Tensor>& d_sources, Tensor* dw, Tensor* dgamma) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(w.device().index));
  if (w.dtype() == DType::kBF16) {
    return MixGrad<__nv_bfloat16>(sources, w, gamma, eps, p, dh, d_sources, dw, dgamma,
                                  ctx->stream());
  }
  return MixGrad<float>(sources, w, gamma, eps, p, dh, d_sources, dw, dgamma, ctx->stream());
}

}  // namespace orrery::kernels::cuda
