// The dq pass of the causal attention backward (kernels/attention.h) on Hopper: wgmma with TMA
// loads and warp specialisation, the forward's structure (attention_forward_wgmma.cu), bf16 in,
// f32 accumulate, deterministic (each dq element summed in one thread's registers in a fixed
// order and written once, no atomics). The dk/dv pass is attention_backward_dkdv_wgmma.cu;
// D = rowsum(dO * O) comes from the preprocess (attention_backward.cu).
//
// One CTA of three warpgroups per (128-query tile, head), one CTA per SM:
//   producer (warpgroup 0, 24 registers): TMA loads of Q [128][dqk] and dO [128][dv] once, then
//     of 64-key tiles K [64][dqk] and V [64][dv] into a ring of kStages stages (3 at dqk 192, 4
//     at 128), from the first query's document start to the last query, as the forward streams.
//   consumers (warpgroups 1 and 2, 240 registers): warpgroup c owns query rows 64 c .. + 63 and
//     per key tile j forms S = Q K_j^T and dP = dO V_j^T by wgmma.m64n64k16 (operands from shared
//     memory, K-major), then P = exp2(S scale log2 e - lse log2 e) (0 where masked) and
//     dS = P (dP - D) in registers, and dQ += dS K_j by wgmma.m64n{dqk}k16 with dS from the
//     registers (rounded to bf16) and K_j read transposed (MN-major descriptor). The dQ product of
//     tile j - 1 runs while S and dP of tile j compute and dS_j is formed; V_j is released as soon
//     as dP_j lands, K_j once dQ has used it. The two consumers issue in turns (ping-pong).
// Masks per element only on the tiles that cross the diagonal or a document start. dq is scaled
// by `scale` on store. Shared memory: 128 (dqk + dv) + kStages 64 (dqk + dv) bf16 = 200 KB at
// 192/128, 192 KB at 128/128.
//
// Requires what the forward requires (AttentionWgmmaSupported) and a 16-byte aligned dO.
// Measured time: not yet timed on the H200 (tests/gpu/attention_gpu_bench.cc).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/attention_tc_layout.h"
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/kda_mma.cuh"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/wgmma_layout.h"

namespace orrery::kernels::cuda {
namespace attention_wgmma {
namespace {

using bf16 = __nv_bfloat16;
using attention_tc::ClampToTile;
using attention_tc::DocStart;
using attention_tc::KeyTiles;
using attention_tc::KeyTileWhollyVisible;
using hopper::BarrierArriveExpectTx;
using hopper::BarrierWait;
using hopper::FenceRegisters;
using hopper::SmemAddr;
using hopper::WgmmaCommit;
using hopper::WgmmaFence;
using hopper::WgmmaWait;
using wgmma::AccCol;
using wgmma::KMajorDescriptor;
using wgmma::kRowBytes;
using wgmma::MnMajorDescriptor;

constexpr int kBlockM = 128;  // query rows of a CTA
constexpr int kBlockN = 64;   // keys of a streamed tile (the wgmma N of S and dP)

template <int kStages>
struct DqBarriers {
  uint64_t rows_full;  // Q and dO
  uint64_t k_full[kStages], k_empty[kStages];
  uint64_t v_full[kStages], v_empty[kStages];
  uint64_t turn[2];
  uint32_t stalled;
};

// The shared-memory plan: Q, dO, the K ring, the V ring, the mbarriers.
template <int kDqk, int kDv>
struct DqPlan {
  static_assert(kDqk % 64 == 0 && kDv == 128, "tiles are 64-column blocks; dP's K is 128");
  static constexpr uint32_t kQBytes = kBlockM * kDqk * 2;
  static constexpr uint32_t kDoBytes = kBlockM * kDv * 2;
  static constexpr uint32_t kKBytes = kBlockN * kDqk * 2;
  static constexpr uint32_t kVBytes = kBlockN * kDv * 2;
  static constexpr size_t Bytes(int stages) {
    return kQBytes + kDoBytes + stages * (kKBytes + kVBytes) + sizeof(DqBarriers<4>) + 1024;
  }
  static constexpr int kStages = Bytes(4) <= kSharedLimit ? 4 : Bytes(3) <= kSharedLimit ? 3 : 2;
  static constexpr uint32_t kDo = kQBytes;  // byte offsets, 1024-aligned
  static constexpr uint32_t kK = kDo + kDoBytes;
  static constexpr uint32_t kV = kK + kStages * kKBytes;
  static constexpr uint32_t kBarriers = kV + kStages * kVBytes;
  static constexpr size_t kSmemBytes = kBarriers + sizeof(DqBarriers<kStages>) + 1024;
  static_assert(kSmemBytes <= kSharedLimit, "shared memory plan too large");
};

struct DqProblem {
  const int64_t* cu;
  int64_t entries, n;
  int heads, m_blocks;
  float scale, scale_log2;
  const float *lse, *dsum;
  bf16* dq;
};

// The producer: Q and dO once, then K and V of every tile into the ring (one thread).
template <int kDqk, int kDv, int kStages>
__device__ void ProduceDq(const CUtensorMap* q_map, const CUtensorMap* do_map,
                          const CUtensorMap* k_map, const CUtensorMap* v_map, unsigned char* smem,
                          DqBarriers<kStages>* bars, int h, int64_t q0, int64_t kv_begin,
                          int tiles) {
  using P = DqPlan<kDqk, kDv>;
  hopper::TmaPrefetch(q_map);
  hopper::TmaPrefetch(do_map);
  hopper::TmaPrefetch(k_map);
  hopper::TmaPrefetch(v_map);
  const int qk_col = h * kDqk, v_col = h * kDv;
  BarrierArriveExpectTx(&bars->rows_full, P::kQBytes + P::kDoBytes);
#pragma unroll
  for (int b = 0; b < kDqk / 64; ++b) {
    hopper::TmaLoad2d(smem + b * kBlockM * kRowBytes, q_map, qk_col + 64 * b, static_cast<int>(q0),
                      &bars->rows_full);
  }
#pragma unroll
  for (int b = 0; b < kDv / 64; ++b) {
    hopper::TmaLoad2d(smem + P::kDo + b * kBlockM * kRowBytes, do_map, v_col + 64 * b,
                      static_cast<int>(q0), &bars->rows_full);
  }
  for (int t = 0; t < tiles; ++t) {
    const int s = t % kStages;
    const uint32_t parity = ((t / kStages) & 1) ^ 1;  // the previous use's release
    const int kb = static_cast<int>(kv_begin + static_cast<int64_t>(t) * kBlockN);
    BarrierWait(&bars->k_empty[s], parity, &bars->stalled);
    if (Stalled(&bars->stalled)) return;
    BarrierArriveExpectTx(&bars->k_full[s], P::kKBytes);
#pragma unroll
    for (int b = 0; b < kDqk / 64; ++b) {
      hopper::TmaLoad2d(smem + P::kK + s * P::kKBytes + b * kBlockN * kRowBytes, k_map,
                        qk_col + 64 * b, kb, &bars->k_full[s]);
    }
    BarrierWait(&bars->v_empty[s], parity, &bars->stalled);
    if (Stalled(&bars->stalled)) return;
    BarrierArriveExpectTx(&bars->v_full[s], P::kVBytes);
#pragma unroll
    for (int b = 0; b < kDv / 64; ++b) {
      hopper::TmaLoad2d(smem + P::kV + s * P::kVBytes + b * kBlockN * kRowBytes, v_map,
                        v_col + 64 * b, kb, &bars->v_full[s]);
    }
  }
}

// Issues dQ += dS K against the K tile at k_tile (read transposed; one commit group).
template <int kDqk>
__device__ __forceinline__ void IssueDsK(float (&dq)[kDqk / 2], const uint32_t (&ds)[kBlockN / 4],
                                         uint32_t k_tile) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    const uint32_t a[4] = {ds[4 * kk], ds[4 * kk + 1], ds[4 * kk + 2], ds[4 * kk + 3]};
    if constexpr (kDqk == 192) {
      hopper::WgmmaM64N192K16RS(dq, a, MnMajorDescriptor(k_tile, kBlockN, kk), 1);
    } else {
      hopper::WgmmaM64N128K16RS(dq, a, MnMajorDescriptor(k_tile, kBlockN, kk), 1);
    }
  }
  WgmmaCommit();
}

// Issues S = Q K^T and dP = dO V^T for the consumer's 64 rows against the tiles at k_tile and
// v_tile (one commit group).
template <int kDqk, int kDv>
__device__ __forceinline__ void IssueSdP(float (&s)[kBlockN / 2], float (&dp)[kBlockN / 2],
                                         uint32_t q_rows, uint32_t do_rows, uint32_t k_tile,
                                         uint32_t v_tile) {
#pragma unroll
  for (int kk = 0; kk < kDqk / 16; ++kk) {
    hopper::WgmmaM64N64K16SS(s, KMajorDescriptor(q_rows, kBlockM * kRowBytes, kk),
                             KMajorDescriptor(k_tile, kBlockN * kRowBytes, kk), kk > 0 ? 1 : 0);
  }
#pragma unroll
  for (int kk = 0; kk < kDv / 16; ++kk) {
    hopper::WgmmaM64N64K16SS(dp, KMajorDescriptor(do_rows, kBlockM * kRowBytes, kk),
                             KMajorDescriptor(v_tile, kBlockN * kRowBytes, kk), kk > 0 ? 1 : 0);
  }
  WgmmaCommit();
}

// A consumer thread's two rows (accumulator rows g, g + 8): positions, document starts, lse (log2
// units) and D; rows past n see no key and get 0.
struct DsRows {
  int64_t row[2], start[2];
  float lse2[2], dsum[2];
  float scale_log2;

  // dS = P (dP - D) into s for the tile at kb, P = exp2(S scale_log2 - lse2) and 0 for the hidden
  // pairs (key kb + c is visible to row r when start[r] <= kb + c <= row[r]).
  __device__ __forceinline__ void Step(float (&s)[kBlockN / 2], const float (&dp)[kBlockN / 2],
                                       int64_t kb, bool masked) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int lo[2] = {ClampToTile(start[0] - kb, kBlockN), ClampToTile(start[1] - kb, kBlockN)};
    const int hi[2] = {ClampToTile(row[0] - kb, kBlockN), ClampToTile(row[1] - kb, kBlockN)};
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) {
      const int c = AccCol(lane, i), r = (i / 2) % 2;
      const bool visible = !masked || (lo[r] <= c && c <= hi[r]);
      const float p = visible ? Exp2(fmaf(s[i], scale_log2, -lse2[r])) : 0.0f;
      s[i] = p * (dp[i] - dsum[r]);
    }
  }
};

template <int kDqk, int kDv, bool kPingPong>
__global__ void __launch_bounds__(kThreads, 1)
    AttentionDqWgmmaKernel(const __grid_constant__ CUtensorMap q_map,
                           const __grid_constant__ CUtensorMap do_map,
                           const __grid_constant__ CUtensorMap k_map,
                           const __grid_constant__ CUtensorMap v_map, DqProblem pr) {
  using P = DqPlan<kDqk, kDv>;
  constexpr int kStages = P::kStages;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = AlignedShared(smem_raw);
  auto* bars = reinterpret_cast<DqBarriers<kStages>*>(smem + P::kBarriers);

  const int h = static_cast<int>(blockIdx.x % pr.heads);
  const int64_t q0 =
      static_cast<int64_t>(pr.m_blocks - 1 - static_cast<int>(blockIdx.x / pr.heads)) * kBlockM;
  const int64_t q_last = (q0 + kBlockM < pr.n ? q0 + kBlockM : pr.n) - 1;
  const int64_t kv_begin = DocStart(pr.cu, pr.entries, pr.n, q0);
  const int tiles = KeyTiles(kv_begin, q_last, kBlockN);
  const int warpgroup = static_cast<int>(threadIdx.x / 128);

  if (threadIdx.x == 0) {
    hopper::BarrierInit(&bars->rows_full, 1);
    for (int s = 0; s < kStages; ++s) {
      hopper::BarrierInit(&bars->k_full[s], 1);
      hopper::BarrierInit(&bars->v_full[s], 1);
      hopper::BarrierInit(&bars->k_empty[s], kConsumerWarps);
      hopper::BarrierInit(&bars->v_empty[s], kConsumerWarps);
    }
    hopper::BarrierInit(&bars->turn[0], kConsumerWarps / 2);
    hopper::BarrierInit(&bars->turn[1], kConsumerWarps / 2);
    bars->stalled = 0;
    hopper::BarrierInitFence();
  }
  __syncthreads();

  if (warpgroup == 0) {
    hopper::RegistersDecrease<kProducerRegisters>();
    if (threadIdx.x == 0) {
      ProduceDq<kDqk, kDv, kStages>(&q_map, &do_map, &k_map, &v_map, smem, bars, h, q0, kv_begin,
                                    tiles);
    }
    return;
  }
  hopper::RegistersIncrease<kConsumerRegisters>();

  const int consumer = warpgroup - 1;
  const int warp = static_cast<int>(threadIdx.x / 32) % 4;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t last_start = DocStart(pr.cu, pr.entries, pr.n, q_last);  // the latest row start
  DsRows rows;
  rows.row[0] = q0 + consumer * kConsumerRows + 16 * warp + lane / 4;
  rows.row[1] = rows.row[0] + 8;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    rows.start[r] = DocStart(pr.cu, pr.entries, pr.n, rows.row[r]);
    const bool in = rows.row[r] < pr.n;
    rows.lse2[r] = in ? pr.lse[rows.row[r] * pr.heads + h] * kLog2e : 0.0f;
    rows.dsum[r] = in ? pr.dsum[rows.row[r] * pr.heads + h] : 0.0f;
  }
  rows.scale_log2 = pr.scale_log2;

  const uint32_t q_rows = SmemAddr(smem) + consumer * kConsumerRows * kRowBytes;
  const uint32_t do_rows = SmemAddr(smem + P::kDo) + consumer * kConsumerRows * kRowBytes;
  const uint32_t k_ring = SmemAddr(smem + P::kK), v_ring = SmemAddr(smem + P::kV);
  float s[kBlockN / 2], dp[kBlockN / 2], dq[kDqk / 2];
  uint32_t ds[kBlockN / 4];
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i) s[i] = dp[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < kDqk / 2; ++i) dq[i] = 0.0f;

  Turns<kPingPong> turns{bars->turn, &bars->stalled, consumer};
  turns.Start();
  BarrierWait(&bars->rows_full, 0, &bars->stalled);
  // Tile 0: S and dP alone (there is no dS yet).
  BarrierWait(&bars->k_full[0], 0, &bars->stalled);
  BarrierWait(&bars->v_full[0], 0, &bars->stalled);
  turns.Take();
  FenceRegisters(s);
  FenceRegisters(dp);
  WgmmaFence();
  IssueSdP<kDqk, kDv>(s, dp, q_rows, do_rows, k_ring, v_ring);
  turns.Pass();
  WgmmaWait<0>();
  FenceRegisters(s);
  FenceRegisters(dp);
  Release(&bars->v_empty[0]);
  rows.Step(s, dp, kv_begin, !KeyTileWhollyVisible(kv_begin, kBlockN, q0, last_start));
  AccumulatorsAsA<kBlockN>(ds, s);

  for (int t = 1; t < tiles; ++t) {
    const int st = t % kStages, sp = (t - 1) % kStages;
    const uint32_t parity = (t / kStages) & 1;
    const int64_t kb = kv_begin + static_cast<int64_t>(t) * kBlockN;
    // Both waits before the fence: no branch between it and the products.
    BarrierWait(&bars->k_full[st], parity, &bars->stalled);
    BarrierWait(&bars->v_full[st], parity, &bars->stalled);
    turns.Take();
    FenceRegisters(s);
    FenceRegisters(dp);
    FenceRegisters(dq);
    FenceRegisters(ds);
    WgmmaFence();
    IssueSdP<kDqk, kDv>(s, dp, q_rows, do_rows, k_ring + st * P::kKBytes, v_ring + st * P::kVBytes);
    IssueDsK<kDqk>(dq, ds, k_ring + sp * P::kKBytes);
    turns.Pass();
    WgmmaWait<1>();  // S and dP landed; the previous tile's dS K may still run
    FenceRegisters(s);
    FenceRegisters(dp);
    Release(&bars->v_empty[st]);
    rows.Step(s, dp, kb, !KeyTileWhollyVisible(kb, kBlockN, q0, last_start));
    WgmmaWait<0>();
    FenceRegisters(dq);
    Release(&bars->k_empty[sp]);
    AccumulatorsAsA<kBlockN>(ds, s);
  }
  // The last tile's dS K.
  const int sl = (tiles - 1) % kStages;
  turns.Take();
  FenceRegisters(dq);
  FenceRegisters(ds);
  WgmmaFence();
  IssueDsK<kDqk>(dq, ds, k_ring + sl * P::kKBytes);
  turns.Pass();
  WgmmaWait<0>();
  FenceRegisters(dq);
  Release(&bars->k_empty[sl]);

  // dq = scale dQ for the rows below n; a stalled pipeline poisons them instead of hanging.
  const float out_scale = Stalled(&bars->stalled) ? NAN : pr.scale;
  const int t4 = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows.row[r] > q_last) continue;
    bf16* dqrow = pr.dq + rows.row[r] * pr.heads * kDqk + static_cast<int64_t>(h) * kDqk + 2 * t4;
#pragma unroll
    for (int j = 0; j < kDqk / 8; ++j) {
      *reinterpret_cast<uint32_t*>(dqrow + 8 * j) =
          PackBf16(dq[4 * j + 2 * r] * out_scale, dq[4 * j + 2 * r + 1] * out_scale);
    }
  }
}

template <int kDqk, int kDv, bool kPingPong>
Status Dq(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse, const Tensor& dsum,
          const Tensor& d_o, const Tensor& cu, double scale, Tensor* dq, cudaStream_t stream) {
  const int64_t n = q.dim(0), heads = q.dim(1);
  ORRERY_ASSIGN_OR_RETURN(const CUtensorMap q_map,
                          Bf16TileMap(q.raw_data(), n, heads * kDqk, heads * kDqk, kBlockM));
  ORRERY_ASSIGN_OR_RETURN(const CUtensorMap do_map,
                          Bf16TileMap(d_o.raw_data(), n, heads * kDv, heads * kDv, kBlockM));
  ORRERY_ASSIGN_OR_RETURN(const CUtensorMap k_map,
                          Bf16TileMap(k.raw_data(), n, heads * kDqk, heads * kDqk, kBlockN));
  ORRERY_ASSIGN_OR_RETURN(const CUtensorMap v_map,
                          Bf16TileMap(v.raw_data(), n, heads * kDv, heads * kDv, kBlockN));
  DqProblem pr;
  pr.cu = cu.data<int64_t>();
  pr.entries = cu.numel();
  pr.n = n;
  pr.heads = static_cast<int>(heads);
  pr.m_blocks = static_cast<int>((n + kBlockM - 1) / kBlockM);
  pr.scale = static_cast<float>(scale);
  pr.scale_log2 = static_cast<float>(scale) * kLog2e;
  pr.lse = lse.data<float>();
  pr.dsum = dsum.data<float>();
  pr.dq = static_cast<bf16*>(dq->raw_data());
  constexpr size_t kSmem = DqPlan<kDqk, kDv>::kSmemBytes;
  auto* kernel = AttentionDqWgmmaKernel<kDqk, kDv, kPingPong>;
  ORRERY_RETURN_IF_ERROR(
      CudaStatus(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                 "AttentionDqWgmmaKernel shared memory"));
  ORRERY_RETURN_IF_ERROR(CheckLaunchRegisters(kernel, "AttentionDqWgmmaKernel"));
  const int64_t blocks = static_cast<int64_t>(pr.m_blocks) * heads;
  kernel<<<static_cast<unsigned>(blocks), kThreads, kSmem, stream>>>(q_map, do_map, k_map, v_map,
                                                                     pr);
  return LastLaunchStatus("AttentionDqWgmmaKernel");
}

}  // namespace
}  // namespace attention_wgmma

Status AttentionDqWgmma(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                        const Tensor& dsum, const Tensor& d_o, const Tensor& cu_seqlens,
                        double scale, Tensor* dq, cudaStream_t stream) {
  using attention_wgmma::Dq;
  if (q.dim(2) == 192) {
    return Dq<192, 128, true>(q, k, v, lse, dsum, d_o, cu_seqlens, scale, dq, stream);
  }
  return Dq<128, 128, true>(q, k, v, lse, dsum, d_o, cu_seqlens, scale, dq, stream);
}

}  // namespace orrery::kernels::cuda
