// Absorbed MLA decode over a paged latent cache (kernels/mla_decode.h): the SIMT split kernel,
// for f32 pages and for the bf16 shapes the tensor-core kernel does not take (D not a multiple of
// 16, dv not a multiple of 64, unaligned tensors). The same blocks as the tensor-core kernel
// (mla_decode_cuda.cuh) with everything in f32 shared memory: the block's 16 query rows
// (16 x D) and one tile of 32 positions (32 x (D + 1), the pad keeps a warp's 32 rows in 32 banks),
// loaded synchronously; scores by 2 rows x 1 position per thread, the online softmax by a warp per
// 2 rows, o by up to 4 columns x 16 rows per thread in registers. D <= kMaxMlaDecodeWidthCuda
// (199 KB of shared memory at 1024), dv <= 4 x 256. Correct first; not yet timed.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/mla_decode_cuda.cuh"

namespace orrery::kernels::cuda {
namespace {

constexpr int kCols = 4;  // columns of o per thread: dv <= kCols * kMlaThreads

size_t SimtSmemBytes(int d) {
  return (static_cast<size_t>(kMlaRows) * d + static_cast<size_t>(kMlaTile) * (d + 1) +
          kMlaRows * kMlaTile + 3 * kMlaRows) *
             sizeof(float) +
         kMlaRows * sizeof(int);
}

__device__ __forceinline__ float SimtWarpMax(float x) {
  for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

template <typename T>
__global__ void __launch_bounds__(kMlaThreads) MlaDecodeSimtKernel(MlaDecodeProblem p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int d = p.d, ldt = p.d + 1;
  float* qs = reinterpret_cast<float*>(smem);  // [16][d]
  float* tile = qs + kMlaRows * d;             // [32][d + 1]
  float* sc = tile + kMlaTile * ldt;           // [16][32]: scores, then weights
  float* m_s = sc + kMlaRows * kMlaTile;
  float* l_s = m_s + kMlaRows;
  float* a_s = l_s + kMlaRows;
  int* lim_s = reinterpret_cast<int*>(a_s + kMlaRows);

  const MlaBlock blk = MlaBlockOf(p);
  const int len = MlaContextLength(p, blk.n);
  int begin, end;
  MlaSplitRange(len, p.splits, blk.s, &begin, &end);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row0 = blk.g * kMlaRows;
  const T* pages = static_cast<const T*>(p.pages);
  const T* q = static_cast<const T*>(p.q) + (static_cast<int64_t>(blk.n) * p.rows + row0) * d;
  for (int i = tid; i < kMlaRows * d; i += kMlaThreads) {
    const int r = i / d;
    qs[i] = row0 + r < p.rows ? ToF(q[i]) : 0.0f;
  }
  if (tid < kMlaRows) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
    a_s[tid] = 1.0f;
    lim_s[tid] = MlaRowLimit(p, row0 + tid, len, end);
  }
  float acc[kCols][kMlaRows];
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
#pragma unroll
    for (int r = 0; r < kMlaRows; ++r) acc[c][r] = 0.0f;
  }

  for (int tb = begin; tb < end; tb += kMlaTile) {
    __syncthreads();  // the previous tile's readers are done (first time: q and the row state)
    for (int i = tid; i < kMlaTile * d; i += kMlaThreads) {
      const int r = i / d, c = i - r * d;
      const int pos = tb + r;
      tile[r * ldt + c] = pos < end ? ToF(pages[MlaRowOffset(p, blk.n, pos) + c]) : 0.0f;
    }
    __syncthreads();
    {  // Scores of rows warp and warp + 8 at position lane.
      const float* kr = tile + lane * ldt;
      const float* q0 = qs + warp * d;
      const float* q1 = qs + (warp + 8) * d;
      float s0 = 0.0f, s1 = 0.0f;
      for (int k = 0; k < d; ++k) {
        const float x = kr[k];
        s0 = fmaf(q0[k], x, s0);
        s1 = fmaf(q1[k], x, s1);
      }
      sc[warp * kMlaTile + lane] = s0;
      sc[(warp + 8) * kMlaTile + lane] = s1;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {  // online softmax: warp w rows 2w, 2w + 1
      const int r = warp * 2 + rr;
      float s = sc[r * kMlaTile + lane] * p.scale;
      if (tb + lane >= lim_s[r]) s = -INFINITY;
      const float m_old = m_s[r];
      const float m_new = fmaxf(m_old, SimtWarpMax(s));
      float pr = 0.0f, alpha = 1.0f;
      if (m_new != -INFINITY) {
        pr = __expf(s - m_new);
        alpha = __expf(m_old - m_new);
      }
      const float sum = WarpSum(pr);
      sc[r * kMlaTile + lane] = pr;
      if (lane == 0) {
        m_s[r] = m_new;
        l_s[r] = l_s[r] * alpha + sum;
        a_s[r] = alpha;
      }
    }
    __syncthreads();
#pragma unroll
    for (int ci = 0; ci < kCols; ++ci) {
      const int c = tid + ci * kMlaThreads;
      if (c >= p.dv) continue;
#pragma unroll
      for (int r = 0; r < kMlaRows; ++r) acc[ci][r] *= a_s[r];
      for (int t = 0; t < kMlaTile; ++t) {
        const float v = tile[t * ldt + c];
#pragma unroll
        for (int r = 0; r < kMlaRows; ++r) acc[ci][r] = fmaf(sc[r * kMlaTile + t], v, acc[ci][r]);
      }
    }
  }
  __syncthreads();

  const bool direct = p.splits == 1;
  const int64_t base = direct ? static_cast<int64_t>(blk.n) * p.rows
                              : (static_cast<int64_t>(blk.n) * p.splits + blk.s) * p.rows;
#pragma unroll
  for (int ci = 0; ci < kCols; ++ci) {
    const int c = tid + ci * kMlaThreads;
    if (c >= p.dv) continue;
#pragma unroll
    for (int r = 0; r < kMlaRows; ++r) {
      if (row0 + r >= p.rows) continue;
      const float v = l_s[r] > 0.0f ? acc[ci][r] / l_s[r] : 0.0f;
      const int64_t at = (base + row0 + r) * p.dv + c;
      if (direct) {
        static_cast<T*>(p.o)[at] = FromF<T>(v);
      } else {
        p.part_o[at] = v;
      }
    }
  }
  if (tid < kMlaRows && row0 + tid < p.rows) {
    const float v = l_s[tid] > 0.0f ? m_s[tid] + logf(l_s[tid]) : -INFINITY;
    (direct ? p.lse : p.part_lse)[base + row0 + tid] = v;
  }
}

template <typename T>
Status PrepareSimt(const MlaDecodeProblem& p) {
  return CudaStatus(
      cudaFuncSetAttribute(MlaDecodeSimtKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(SimtSmemBytes(p.d))),
      "cudaFuncSetAttribute(MlaDecodeSimtKernel)");
}

template <typename T>
StatusOr<int> BlocksPerSm(const MlaDecodeProblem& p) {
  ORRERY_RETURN_IF_ERROR(PrepareSimt<T>(p));
  int blocks = 0;
  ORRERY_RETURN_IF_ERROR(
      CudaStatus(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, MlaDecodeSimtKernel<T>,
                                                               kMlaThreads, SimtSmemBytes(p.d)),
                 "cudaOccupancyMaxActiveBlocksPerMultiprocessor(MlaDecodeSimtKernel)"));
  return std::max(blocks, 1);
}

template <typename T>
Status Launch(const MlaDecodeProblem& p, cudaStream_t stream) {
  ORRERY_RETURN_IF_ERROR(PrepareSimt<T>(p));
  const int64_t blocks = static_cast<int64_t>(p.n) * p.splits * p.groups;
  MlaDecodeSimtKernel<T>
      <<<static_cast<unsigned>(blocks), kMlaThreads, SimtSmemBytes(p.d), stream>>>(p);
  return LastLaunchStatus("MlaDecodeSimtKernel");
}

}  // namespace

StatusOr<int> MlaDecodeSimtBlocksPerSm(const MlaDecodeProblem& p, bool bf16) {
  return bf16 ? BlocksPerSm<__nv_bfloat16>(p) : BlocksPerSm<float>(p);
}

Status LaunchMlaDecodeSimt(const MlaDecodeProblem& p, bool bf16, cudaStream_t stream) {
  return bf16 ? Launch<__nv_bfloat16>(p, stream) : Launch<float>(p, stream);
}

}  // namespace orrery::kernels::cuda
