// Small helpers shared by the KDA CUDA kernels: error checks and element loads/stores.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "core/status.h"

namespace orrery::kernels::cuda {

inline Status CudaCheck(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::OK();
  return InternalError(std::string("kda cuda: ") + what + ": " + cudaGetErrorString(err));
}

__device__ __forceinline__ float LoadF(const float* p) { return *p; }
__device__ __forceinline__ float LoadF(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void StoreF(float* p, float x) { *p = x; }
__device__ __forceinline__ void StoreF(__nv_bfloat16* p, float x) { *p = __float2bfloat16(x); }

// 2^x on the special-function unit with results below 2^-126 flushed to zero (exp2f adds a
// range fix-up around the same instruction to return those as denormals). In the tensor-core
// kernels a factor that small only ever stands for a term whose true size is below 2^-126: the
// large factors (up to 2^112, on diagonal tiles) are paired with small ones of exponent >= -112
// by the choice of reference rows (docs/kda.md).
__device__ __forceinline__ float Exp2Ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

}  // namespace orrery::kernels::cuda
