// The probes of wgmma_probe.h: one CTA of one warpgroup each, inputs by TMA into 1024-byte aligned
// shared memory, outputs written through the accumulator map of wgmma_layout.h.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/device_context.h"
#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/kda_mma.cuh"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/wgmma_layout.h"
#include "tests/gpu/wgmma_probe.h"

namespace orrery::kernels::wgmma_probe {
namespace {

using bf16 = __nv_bfloat16;
using cuda::CudaStatus;
using cuda::LastLaunchStatus;
using namespace cuda::hopper;  // NOLINT: the primitives under test
using namespace cuda::wgmma;   // NOLINT

constexpr int kRows = 128;                          // rows of every TMA box and tile here
constexpr uint32_t kTileBlock = kRows * kRowBytes;  // one 64-column block of a 128-row tile
constexpr size_t kSmem = 3 * kRows * 192 * 2 + 2048;

struct Shared {
  unsigned char* tiles;
  uint64_t* bar;
  uint32_t* stalled;
};
__device__ Shared Carve(unsigned char* raw, uint32_t tile_bytes) {
  unsigned char* tiles = raw + ((1024 - (SmemAddr(raw) & 1023)) & 1023);
  auto* bar = reinterpret_cast<uint64_t*>(tiles + tile_bytes);
  return {tiles, bar, reinterpret_cast<uint32_t*>(bar + 1)};
}

// Thread 0 loads `count` [rows[i]][cols[i]] tiles (maps[i], boxes of rows[i] rows, at column x0
// and row y0) back to back, each as 64-column blocks; everyone waits.
__device__ void LoadTiles(const Shared& sh, const CUtensorMap* const* maps, const int* rows,
                          const int* cols, int count, int x0, int y0) {
  if (threadIdx.x == 0) {
    BarrierInit(sh.bar, 1);
    *sh.stalled = 0;
    BarrierInitFence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t bytes = 0;
    for (int i = 0; i < count; ++i) bytes += rows[i] * cols[i] * 2;
    BarrierArriveExpectTx(sh.bar, bytes);
    uint32_t off = 0;
    for (int i = 0; i < count; ++i) {
      for (int b = 0; b < cols[i] / 64; ++b) {
        TmaLoad2d(sh.tiles + off + b * rows[i] * kRowBytes, maps[i], x0 + 64 * b, y0, sh.bar);
      }
      off += rows[i] * cols[i] * 2;
    }
  }
  BarrierWait(sh.bar, 0, sh.stalled);
}

// Writes the m64nN accumulators (kRegs = N / 2) to d [64][N] (NaN everywhere when the wait
// stalled).
template <int kRegs>
__device__ void StoreAccumulators(const Shared& sh, const float (&acc)[kRegs], float* d) {
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const bool stalled = *static_cast<volatile uint32_t*>(sh.stalled) != 0;
#pragma unroll
  for (int i = 0; i < kRegs; ++i) {
    d[AccRow(warp, lane, i) * 2 * kRegs + AccCol(lane, i)] =
        stalled ? __int_as_float(0x7fc00000) : acc[i];
  }
}

__global__ void __launch_bounds__(128)
    TmaBoxKernel(const __grid_constant__ CUtensorMap map, int x0, int y0, float* out) {
  extern __shared__ unsigned char raw[];
  const Shared sh = Carve(raw, kRows * 64 * 2);
  const CUtensorMap* maps[1] = {&map};
  const int rows[1] = {kRows}, cols[1] = {64};
  LoadTiles(sh, maps, rows, cols, 1, x0, y0);
  const bool stalled = *static_cast<volatile uint32_t*>(sh.stalled) != 0;
  const bf16* box = reinterpret_cast<const bf16*>(sh.tiles);
  for (int e = static_cast<int>(threadIdx.x); e < kRows * 64; e += 128) {
    out[e] = stalled ? __int_as_float(0x7fc00000) : __bfloat162float(box[e]);
  }
}

// d [64][kN] = A[64 half ..][kK] B^T, A a [128][kK] tile, B a [kN][kK] tile.
template <int kK, int kN>
__global__ void __launch_bounds__(128)
    ProductSSKernel(const __grid_constant__ CUtensorMap a_map,
                    const __grid_constant__ CUtensorMap b_map, int half, float* d) {
  extern __shared__ unsigned char raw[];
  const Shared sh = Carve(raw, (kRows + kN) * kK * 2);
  const CUtensorMap* maps[2] = {&a_map, &b_map};
  const int rows[2] = {kRows, kN}, cols[2] = {kK, kK};
  LoadTiles(sh, maps, rows, cols, 2, 0, 0);
  const uint32_t a = SmemAddr(sh.tiles) + static_cast<uint32_t>(half) * 64 * kRowBytes;
  const uint32_t b = SmemAddr(sh.tiles) + kRows * kK * 2;
  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.0f;
  FenceRegisters(acc);
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    const uint64_t da = KMajorDescriptor(a, kTileBlock, kk);
    const uint64_t db = KMajorDescriptor(b, kN * kRowBytes, kk);
    if constexpr (kN == 64) {
      WgmmaM64N64K16SS(acc, da, db, kk > 0 ? 1 : 0);
    } else {
      WgmmaM64N128K16SS(acc, da, db, kk > 0 ? 1 : 0);
    }
  }
  WgmmaCommit();
  WgmmaWait<0>();
  FenceRegisters(acc);
  StoreAccumulators(sh, acc, d);
}

// A's fragment of k step kk (wgmma_layout.h: FragARow, FragACol) from the row-major [64][cols] a.
__device__ void LoadFragA(uint32_t (&r)[4], const float* a, int cols, int kk) {
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float* row = a + FragARow(warp, lane, j) * cols + 16 * kk;
    r[j] = cuda::PackBf16(row[FragACol(lane, j, 0)], row[FragACol(lane, j, 1)]);
  }
}

// d [64][kN] = a [64][kK] B, A from registers, B a row-major [kK][kN] tile read transposed.
template <int kK, int kN>
__global__ void __launch_bounds__(128)
    ProductRSKernel(const __grid_constant__ CUtensorMap b_map, const float* a, float* d) {
  extern __shared__ unsigned char raw[];
  const Shared sh = Carve(raw, kK * kN * 2);
  const CUtensorMap* maps[1] = {&b_map};
  const int rows[1] = {kK}, cols[1] = {kN};
  LoadTiles(sh, maps, rows, cols, 1, 0, 0);
  uint32_t frag[kK / 16][4];
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) LoadFragA(frag[kk], a, kK, kk);
  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.0f;
  FenceRegisters(acc);
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    const uint64_t db = MnMajorDescriptor(SmemAddr(sh.tiles), kK, kk);
    if constexpr (kN == 192) {
      WgmmaM64N192K16RS(acc, frag[kk], db, 1);
    } else {
      WgmmaM64N128K16RS(acc, frag[kk], db, 1);
    }
  }
  WgmmaCommit();
  WgmmaWait<0>();
  FenceRegisters(acc);
  StoreAccumulators(sh, acc, d);
}

template <int kDqk>
__global__ void __launch_bounds__(128)
    ChainKernel(const __grid_constant__ CUtensorMap q_map,
                const __grid_constant__ CUtensorMap k_map,
                const __grid_constant__ CUtensorMap v_map, int half, float* s_out, float* o_out) {
  extern __shared__ unsigned char raw[];
  const Shared sh = Carve(raw, 2 * kRows * kDqk * 2 + kRows * 128 * 2);
  const CUtensorMap* maps[3] = {&q_map, &k_map, &v_map};
  const int rows[3] = {kRows, kRows, kRows}, cols[3] = {kDqk, kDqk, 128};
  LoadTiles(sh, maps, rows, cols, 3, 0, 0);
  const uint32_t q = SmemAddr(sh.tiles) + static_cast<uint32_t>(half) * 64 * kRowBytes;
  const uint32_t k = SmemAddr(sh.tiles) + kRows * kDqk * 2;
  const uint32_t v = SmemAddr(sh.tiles) + 2 * kRows * kDqk * 2;
  float s[64], o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) s[i] = o[i] = 0.0f;
  FenceRegisters(s);
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kDqk / 16; ++kk) {
    WgmmaM64N128K16SS(s, KMajorDescriptor(q, kTileBlock, kk), KMajorDescriptor(k, kTileBlock, kk),
                      kk > 0 ? 1 : 0);
  }
  WgmmaCommit();
  WgmmaWait<0>();
  FenceRegisters(s);
  uint32_t p[32];
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      p[4 * kk + j] = cuda::PackBf16(s[AccumulatorOfA(kk, j, 0)], s[AccumulatorOfA(kk, j, 1)]);
    }
  }
  FenceRegisters(p);
  FenceRegisters(o);
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
    WgmmaM64N128K16RS(o, a, MnMajorDescriptor(v, kRows, kk), 1);
  }
  WgmmaCommit();
  WgmmaWait<0>();
  FenceRegisters(o);
  StoreAccumulators(sh, s, s_out);
  StoreAccumulators(sh, o, o_out);
}

// Device copies of bf16 matrices and f32 results, freed on scope exit.
struct DeviceBuffers {
  std::vector<void*> ptrs;
  ~DeviceBuffers() {
    for (void* p : ptrs) cudaFree(p);
  }
  StatusOr<bf16*> Bf16(const std::vector<float>& x) {
    std::vector<bf16> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = __float2bfloat16(x[i]);
    void* p = nullptr;
    ORRERY_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, h.size() * sizeof(bf16)), "probe cudaMalloc"));
    ptrs.push_back(p);
    ORRERY_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy(p, h.data(), h.size() * sizeof(bf16), cudaMemcpyHostToDevice), "probe copy"));
    return static_cast<bf16*>(p);
  }
  StatusOr<float*> F32(const std::vector<float>& x) {
    void* p = nullptr;
    ORRERY_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, x.size() * 4), "probe cudaMalloc"));
    ptrs.push_back(p);
    ORRERY_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(p, x.data(), x.size() * 4, cudaMemcpyHostToDevice), "probe copy"));
    return static_cast<float*>(p);
  }
};

Status Fetch(const float* d, size_t count, std::vector<float>* out) {
  ORRERY_RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "probe kernel"));
  out->resize(count);
  return CudaStatus(cudaMemcpy(out->data(), d, count * 4, cudaMemcpyDeviceToHost), "probe fetch");
}

template <typename Kernel>
Status AllowSmem(Kernel kernel) {
  return CudaStatus(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kSmem)),
                    "probe shared memory");
}

}  // namespace

Status TmaBox(const std::vector<float>& x, int rows, int cols, int x0, int y0,
              std::vector<float>* smem) {
  DeviceBuffers buf;
  ORRERY_ASSIGN_OR_RETURN(bf16 * dx, buf.Bf16(x));
  ORRERY_ASSIGN_OR_RETURN(float* out, buf.F32(std::vector<float>(kRows * 64, 0.0f)));
  ORRERY_ASSIGN_OR_RETURN(const CUtensorMap map, cuda::Bf16TileMap(dx, rows, cols, cols, kRows));
  ORRERY_RETURN_IF_ERROR(AllowSmem(TmaBoxKernel));
  TmaBoxKernel<<<1, 128, kSmem>>>(map, x0, y0, out);
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("TmaBoxKernel"));
  return Fetch(out, kRows * 64, smem);
}

Status ProductSS(const std::vector<float>& a, const std::vector<float>& b, int k, int b_rows,
                 int half, std::vector<float>* d) {
  if ((k != 128 && k != 192) || (b_rows != 64 && b_rows != 128)) {
    return InvalidArgumentError("ProductSS: k must be 128 or 192, b_rows 64 or 128");
  }
  DeviceBuffers buf;
  ORRERY_ASSIGN_OR_RETURN(bf16 * da, buf.Bf16(a));
  ORRERY_ASSIGN_OR_RETURN(bf16 * db, buf.Bf16(b));
  ORRERY_ASSIGN_OR_RETURN(float* out, buf.F32(std::vector<float>(64 * b_rows, 0.0f)));
  ORRERY_ASSIGN_OR_RETURN(const CUtensorMap a_map, cuda::Bf16TileMap(da, kRows, k, k, kRows));
  ORRERY_ASSIGN_OR_RETURN(const CUtensorMap b_map, cuda::Bf16TileMap(db, b_rows, k, k, b_rows));
  const auto launch = [&](auto kernel) -> Status {
    ORRERY_RETURN_IF_ERROR(AllowSmem(kernel));
    kernel<<<1, 128, kSmem>>>(a_map, b_map, half, out);
    return LastLaunchStatus("ProductSSKernel");
  };
  const Status st =
      k == 192
          ? (b_rows == 64 ? launch(ProductSSKernel<192, 64>) : launch(ProductSSKernel<192, 128>))
          : (b_rows == 64 ? launch(ProductSSKernel<128, 64>) : launch(ProductSSKernel<128, 128>));
  ORRERY_RETURN_IF_ERROR(st);
  return Fetch(out, 64 * b_rows, d);
}

Status ProductRS(const std::vector<float>& a, const std::vector<float>& b, int k, int n,
                 std::vector<float>* d) {
  if ((k != 64 && k != 128) || (n != 128 && n != 192)) {
    return InvalidArgumentError("ProductRS: k must be 64 or 128, n 128 or 192");
  }
  DeviceBuffers buf;
  ORRERY_ASSIGN_OR_RETURN(float* da, buf.F32(a));
  ORRERY_ASSIGN_OR_RETURN(bf16 * db, buf.Bf16(b));
  ORRERY_ASSIGN_OR_RETURN(float* out, buf.F32(std::vector<float>(64 * n, 0.0f)));
  ORRERY_ASSIGN_OR_RETURN(const CUtensorMap b_map, cuda::Bf16TileMap(db, k, n, n, k));
  const auto launch = [&](auto kernel) -> Status {
    ORRERY_RETURN_IF_ERROR(AllowSmem(kernel));
    kernel<<<1, 128, kSmem>>>(b_map, da, out);
    return LastLaunchStatus("ProductRSKernel");
  };
  const Status st =
      k == 64 ? (n == 192 ? launch(ProductRSKernel<64, 192>) : launch(ProductRSKernel<64, 128>))
              : (n == 192 ? launch(ProductRSKernel<128, 192>) : launch(ProductRSKernel<128, 128>));
  ORRERY_RETURN_IF_ERROR(st);
  return Fetch(out, 64 * n, d);
}

Status Chain(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
             int dqk, int half, std::vector<float>* s, std::vector<float>* o) {
  if (dqk != 128 && dqk != 192) return InvalidArgumentError("Chain: dqk must be 128 or 192");
  DeviceBuffers buf;
  ORRERY_ASSIGN_OR_RETURN(bf16 * dq, buf.Bf16(q));
  ORRERY_ASSIGN_OR_RETURN(bf16 * dk, buf.Bf16(k));
  ORRERY_ASSIGN_OR_RETURN(bf16 * dv, buf.Bf16(v));
  ORRERY_ASSIGN_OR_RETURN(float* s_out, buf.F32(std::vector<float>(64 * 128, 0.0f)));
  ORRERY_ASSIGN_OR_RETURN(float* o_out, buf.F32(std::vector<float>(64 * 128, 0.0f)));
  ORRERY_ASSIGN_OR_RETURN(const CUtensorMap q_map, cuda::Bf16TileMap(dq, kRows, dqk, dqk, kRows));
  ORRERY_ASSIGN_OR_RETURN(const CUtensorMap k_map, cuda::Bf16TileMap(dk, kRows, dqk, dqk, kRows));
  ORRERY_ASSIGN_OR_RETURN(const CUtensorMap v_map, cuda::Bf16TileMap(dv, kRows, 128, 128, kRows));
  if (dqk == 192) {
    ORRERY_RETURN_IF_ERROR(AllowSmem(ChainKernel<192>));
    ChainKernel<192><<<1, 128, kSmem>>>(q_map, k_map, v_map, half, s_out, o_out);
  } else {
    ORRERY_RETURN_IF_ERROR(AllowSmem(ChainKernel<128>));
    ChainKernel<128><<<1, 128, kSmem>>>(q_map, k_map, v_map, half, s_out, o_out);
  }
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("ChainKernel"));
  ORRERY_RETURN_IF_ERROR(Fetch(s_out, 64 * 128, s));
  return Fetch(o_out, 64 * 128, o);
}

}  // namespace orrery::kernels::wgmma_probe
