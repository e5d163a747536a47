// Absorbed MLA decode over a paged latent cache (kernels/mla_decode.h): the merge of the split
// kernels' partials. One block of 128 threads per query row (n, r): the splits' log-sum-exps
// l_s give weights w_s = exp(l_s - max), o = sum_s w_s o_s / sum_s w_s (the partials are
// normalised per split) and lse = max + log sum_s w_s; a row no split saw (all -inf) gets o = 0
// and lse = -inf. Reads N R splits (dv + 1) f32: small next to the latents; not yet timed.
#include <cmath>

#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/mla_decode_cuda.cuh"
#include "kernels/mla_decode.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kMergeThreads = 128;

template <typename T>
__global__ void __launch_bounds__(kMergeThreads) MlaDecodeMergeKernel(MlaDecodeProblem p) {
  __shared__ float w[kMaxMlaDecodeSplits];
  __shared__ float mx_s;
  const int64_t row = blockIdx.x;  // n * R + r
  const int64_t n = row / p.rows, r = row % p.rows;
  const float* lse_s = p.part_lse + n * p.splits * p.rows + r;  // split s at s * R
  if (threadIdx.x == 0) {
    float mx = -INFINITY;
    for (int s = 0; s < p.splits; ++s) mx = fmaxf(mx, lse_s[static_cast<int64_t>(s) * p.rows]);
    mx_s = mx;
  }
  __syncthreads();
  const float mx = mx_s;
  for (int s = threadIdx.x; s < p.splits; s += kMergeThreads) {
    w[s] = mx == -INFINITY ? 0.0f : __expf(lse_s[static_cast<int64_t>(s) * p.rows] - mx);
  }
  __syncthreads();
  float sum = 0.0f;
  for (int s = 0; s < p.splits; ++s) sum += w[s];
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  const float* po = p.part_o + (n * p.splits * p.rows + r) * p.dv;  // split s at s * R * dv
  const int64_t split_stride = static_cast<int64_t>(p.rows) * p.dv;
  T* o = static_cast<T*>(p.o) + row * p.dv;
  for (int c = threadIdx.x; c < p.dv; c += kMergeThreads) {
    float acc = 0.0f;
    for (int s = 0; s < p.splits; ++s) {
      if (w[s] > 0.0f) acc = fmaf(w[s], po[s * split_stride + c], acc);
    }
    o[c] = FromF<T>(acc * inv);
  }
  if (threadIdx.x == 0) p.lse[row] = sum > 0.0f ? mx + logf(sum) : -INFINITY;
}

}  // namespace

Status LaunchMlaDecodeMerge(const MlaDecodeProblem& p, bool bf16, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(static_cast<int64_t>(p.n) * p.rows);
  if (blocks == 0) return Status::OK();
  if (bf16) {
    MlaDecodeMergeKernel<__nv_bfloat16><<<blocks, kMergeThreads, 0, stream>>>(p);
  } else {
    MlaDecodeMergeKernel<float><<<blocks, kMergeThreads, 0, stream>>>(p);
  }
  return LastLaunchStatus("MlaDecodeMergeKernel");
}

}  // namespace orrery::kernels::cuda
