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

}  // namespace orrery::kernels::cuda
