// Small helpers shared by the KDA CUDA kernels: error checks and element loads/stores.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/cuda/device_context.h"
#include "kernels/kda.h"

namespace orrery::kernels::cuda {

inline Status CudaCheck(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::OK();
  return InternalError(std::string("kda cuda: ") + what + ": " + cudaGetErrorString(err));
}

// The stream of the device the tensors live on (DeviceContext): every KDA launch and copy goes
// there, ordered with the other ops of that device.
inline StatusOr<cudaStream_t> StreamOf(const Device& device) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(device.index));
  return ctx->stream();
}

// Lets `kernel` take `bytes` of dynamic shared memory (past the 48 KB default).
template <typename Kernel>
Status AllowSmem(Kernel kernel, size_t bytes) {
  return CudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)),
                   "cudaFuncSetAttribute");
}

// The op's input transforms (KdaInputTransforms, kernels/kda.h) as the kernels take them: the
// tensor-core kernels apply them while a chunk loads, the elementwise pass of
// kda_input_transforms.cu row by row; all off: the inputs are used as given.
struct ChunkInputTransforms {
  bool qk_l2norm = false, beta_sigmoid = false, gate = false, bounded = true;
  float eps = 0.0f, g_min = 0.0f;
  const float *a_log = nullptr, *dt_bias = nullptr;  // optional with gate
};

// The op's transforms as the kernels take them; in holds the raw inputs (a_log, dt_bias f32).
inline ChunkInputTransforms MakeChunkInputTransforms(const KdaInputTransforms& t,
                                                     const KdaInputs& in) {
  ChunkInputTransforms tr;
  tr.qk_l2norm = t.qk_l2norm;
  tr.beta_sigmoid = t.beta_sigmoid;
  tr.gate = t.gate;
  tr.bounded = t.gate_kind == KdaGateKind::kBounded;
  tr.eps = t.l2norm_eps;
  tr.g_min = t.gate_lower_bound;
  tr.a_log = in.a_log.defined() ? in.a_log.data<float>() : nullptr;
  tr.dt_bias = in.dt_bias.defined() ? in.dt_bias.data<float>() : nullptr;
  return tr;
}

// A host table (chunk and segment descriptors) as an i64 tensor on `device`, copied without
// waiting for the work queued before it: the table goes through one of a few pinned staging
// buffers by an asynchronous copy on the device's stream (a copy from pageable memory waits for
// the device to drain first, which left it idle while the host set up the next launches). A
// staging buffer is written again only once its last copy has run.
inline StatusOr<Tensor> Upload(const std::vector<int64_t>& v, const Device& device) {
  if (v.empty()) return Tensor::FromVector<int64_t>({0}, v).To(device);
  struct Staging {
    void* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t copied = nullptr;
  };
  constexpr int kRing = 4;
  static std::mutex mu;
  static Staging ring[kRing];
  static int next = 0;
  const size_t bytes = v.size() * sizeof(int64_t);
  ORRERY_ASSIGN_OR_RETURN(const cudaStream_t stream, StreamOf(device));
  ORRERY_ASSIGN_OR_RETURN(Tensor t,
                          Tensor::Allocate({static_cast<int64_t>(v.size())}, DType::kI64, device));
  std::lock_guard<std::mutex> lock(mu);
  Staging& s = ring[next];
  next = (next + 1) % kRing;
  if (s.copied == nullptr) {
    ORRERY_RETURN_IF_ERROR(
        CudaCheck(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming), "staging event"));
  } else {
    ORRERY_RETURN_IF_ERROR(CudaCheck(cudaEventSynchronize(s.copied), "staging event"));
  }
  if (s.bytes < bytes) {
    if (s.host != nullptr) ORRERY_RETURN_IF_ERROR(CudaCheck(cudaFreeHost(s.host), "cudaFreeHost"));
    s.host = nullptr;
    s.bytes = 0;
    ORRERY_RETURN_IF_ERROR(CudaCheck(cudaMallocHost(&s.host, bytes), "cudaMallocHost"));
    s.bytes = bytes;
  }
  std::memcpy(s.host, v.data(), bytes);
  ORRERY_RETURN_IF_ERROR(
      CudaCheck(cudaMemcpyAsync(t.raw_data(), s.host, bytes, cudaMemcpyHostToDevice, stream),
                "table upload"));
  ORRERY_RETURN_IF_ERROR(CudaCheck(cudaEventRecord(s.copied, stream), "staging event"));
  return t;
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

// Four consecutive elements as floats: one 16-byte f32 or 8-byte bf16 access (aligned to it).
__device__ __forceinline__ float4 LoadF4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float4 LoadF4(const __nv_bfloat16* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&raw.x);
  const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&raw.y);
  return make_float4(__low2float(lo), __high2float(lo), __low2float(hi), __high2float(hi));
}
__device__ __forceinline__ void StoreF4(float* p, float4 x) { *reinterpret_cast<float4*>(p) = x; }
__device__ __forceinline__ void StoreF4(__nv_bfloat16* p, float4 x) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
  uint2 raw;
  raw.x = *reinterpret_cast<const uint32_t*>(&lo);
  raw.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(p) = raw;
}

// 1 / (1 + e^-x) through the special-function unit's reciprocal (__fdividef: relative error about
// 1e-7, without the IEEE division's instruction sequence and its slow path); 0 where e^-x
// overflows (x below about -88).
__device__ __forceinline__ float SigmoidF(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }

__device__ __forceinline__ float SoftplusF(float x) {  // log(1 + e^x) without overflow
  return x > 0.0f ? x + log1pf(__expf(-x)) : log1pf(__expf(x));
}

// The KDA gate (spec §2.2) at x = z + dt_bias with ea = e^A_log: bounded g_min sigmoid(ea x) or
// original -ea softplus(x).
__device__ __forceinline__ float KdaGateValue(float x, float ea, bool bounded, float g_min) {
  return bounded ? g_min * SigmoidF(ea * x) : -ea * SoftplusF(x);
}

// Its derivatives at the same point: *dx = dg/dx (= dg/dz = dg/d dt_bias), *da = dg/dA_log.
__device__ __forceinline__ void KdaGateGrad(float x, float ea, bool bounded, float g_min, float* dx,
                                            float* da) {
  if (bounded) {
    const float s = SigmoidF(ea * x);
    *dx = g_min * s * (1.0f - s) * ea;
    *da = *dx * x;
  } else {
    *dx = -ea * SigmoidF(x);
    *da = -ea * SoftplusF(x);
  }
}

}  // namespace orrery::kernels::cuda
