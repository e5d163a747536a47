// The grouped GEMM kernels' epilogue store (grouped_gemm.cu, grouped_gemm_wgmma.cu): a lane's two
// adjacent f32 sums of one C row written, or added, to f32 or bf16 C (the pair 8- or 4-byte
// aligned: C's columns are even and its row stride a multiple of 8).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/kda_mma.cuh"

namespace orrery::kernels::cuda {

__device__ __forceinline__ void Store2(float* p, float x0, float x1, bool add) {
  float2 v = make_float2(x0, x1);
  if (add) {
    const float2 old = *reinterpret_cast<const float2*>(p);
    v.x += old.x;
    v.y += old.y;
  }
  *reinterpret_cast<float2*>(p) = v;
}

__device__ __forceinline__ void Store2(__nv_bfloat16* p, float x0, float x1, bool add) {
  if (add) {
    const float2 old = UnpackBf16x2(*reinterpret_cast<const uint32_t*>(p));
    x0 += old.x;
    x1 += old.y;
  }
  *reinterpret_cast<uint32_t*>(p) = PackBf16(x0, x1);
}

}  // namespace orrery::kernels::cuda
