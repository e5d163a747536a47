// Shared pieces of the Hopper attention kernels (attention_forward_wgmma.cu,
// attention_backward_dq_wgmma.cu, attention_backward_dkdv_wgmma.cu): the CTA shape of a producer
// warpgroup and two consumer warpgroups, their register shares, a stage release, the consumers'
// ping-pong, and the conversion of accumulators into the next product's A fragments. The PTX
// primitives are in hopper.cuh, the index maps in wgmma_layout.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/status.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/kda_mma.cuh"
#include "kernels/cuda/wgmma_layout.h"

namespace orrery::kernels::cuda::attention_wgmma {

constexpr int kThreads = 3 * 128;  // producer warpgroup + two consumer warpgroups
constexpr int kConsumerRows = 64;  // rows of a consumer warpgroup (one wgmma M)
constexpr int kConsumerWarps = 8;  // arrivals that release a stage
// setmaxnreg moves registers inside the CTA's pool, which is what the launch gave it: 384 threads
// at 168 (__launch_bounds__(384, 1)). The shares must fit it (128 producer + 256 consumer
// registers per thread <= 384 * 168), else setmaxnreg.inc waits forever: 24 / 240 uses it all.
constexpr int kLaunchRegisters = 168;  // 65536 / 384, rounded down to a multiple of 8
constexpr bool RegisterSharesFit(int producer, int consumer) {
  return 128 * producer + 256 * consumer <= kThreads * kLaunchRegisters;
}
constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;
static_assert(RegisterSharesFit(kProducerRegisters, kConsumerRegisters));
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
constexpr size_t kSharedLimit = 227 * 1024;

// The dynamic shared memory from its first 1024-byte aligned address (the swizzle atom).
__device__ __forceinline__ unsigned char* AlignedShared(unsigned char* raw) {
  return raw + ((1024 - (hopper::SmemAddr(raw) & 1023)) & 1023);
}

// One warp's share of releasing a stage (or passing the turn).
__device__ __forceinline__ void Release(uint64_t* bar) {
  __syncwarp();
  if (threadIdx.x % 32 == 0) hopper::BarrierArrive(bar);
}

// Whether a wait of this CTA gave up (hopper::BarrierWait).
__device__ __forceinline__ bool Stalled(uint32_t* stalled) {
  return *static_cast<volatile uint32_t*>(stalled) != 0;
}

// The consumers' ping-pong over two mbarriers turn[0], turn[1] (initialised with kConsumerWarps
// / 2 arrivals): consumer c issues its round r (the products of one step) when turn[c] has
// completed phase r, and then passes the turn to the other, whose arrivals (its 4 warps) complete
// that phase. Consumer 1 passes once before its first round, so consumer 0 goes first. Both
// consumers must run the same number of rounds, so that every wait is matched; the last pass
// completes a phase nobody waits for. Without kPingPong the consumers issue whenever ready.
template <bool kPingPong>
struct Turns {
  uint64_t* turn;
  uint32_t* stalled;
  int consumer;
  uint32_t round = 0;
  __device__ __forceinline__ void Start() {
    if (kPingPong && consumer == 1) Release(&turn[0]);
  }
  __device__ __forceinline__ void Take() {
    if (kPingPong) hopper::BarrierWait(&turn[consumer], round & 1, stalled);
  }
  __device__ __forceinline__ void Pass() {
    if (kPingPong) Release(&turn[1 - consumer]);
    ++round;
  }
};

// 2^x in one MUFU instruction: subnormal results flush to 0 (exp2f without fast math adds a
// rescaling around it for them), harmless for probabilities scaled to at most 1.
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The A fragments (bf16 pairs) of the k steps of a [64][kN] matrix held as m64nkN accumulators
// (wgmma_layout.h, AccumulatorOfA): the next product's operand straight from the registers.
template <int kN>
__device__ __forceinline__ void AccumulatorsAsA(uint32_t (&a)[kN / 4], const float (&d)[kN / 2]) {
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      a[4 * kk + j] =
          PackBf16(d[wgmma::AccumulatorOfA(kk, j, 0)], d[wgmma::AccumulatorOfA(kk, j, 1)]);
    }
  }
}

// Fails unless `kernel` compiled to kLaunchRegisters per thread (the setmaxnreg shares assume it).
template <typename Kernel>
Status CheckLaunchRegisters(Kernel kernel, const char* name) {
  cudaFuncAttributes attr;
  ORRERY_RETURN_IF_ERROR(CudaStatus(cudaFuncGetAttributes(&attr, kernel), name));
  if (attr.numRegs != kLaunchRegisters) {
    return InternalError(std::string(name) + ": compiled to " + std::to_string(attr.numRegs) +
                         " registers per thread, expected " + std::to_string(kLaunchRegisters) +
                         " (the setmaxnreg shares assume it)");
  }
  return Status::OK();
}

}  // namespace orrery::kernels::cuda::attention_wgmma
