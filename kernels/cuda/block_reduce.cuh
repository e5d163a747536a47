// Block-wide reductions for the row kernels of the fused LM head losses (cross_entropy_rows.cu,
// policy_loss_rows.cu): one value per thread of a kThreads-thread block (a multiple of 32) in,
// the block's sum or max out to every thread. `scratch` holds kThreads / 32 floats of shared
// memory; the trailing barrier lets the next reduction reuse it.
#pragma once

namespace orrery::kernels::cuda {

template <bool kMax, int kThreads>
__device__ float BlockReduce(float x, float* scratch) {
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, x, off);
    x = kMax ? fmaxf(x, o) : x + o;
  }
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kThreads / 32; ++w) r = kMax ? fmaxf(r, scratch[w]) : r + scratch[w];
  __syncthreads();  // scratch is reused by the next reduction
  return r;
}

}  // namespace orrery::kernels::cuda
