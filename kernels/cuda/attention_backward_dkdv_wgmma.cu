// The dk/dv pass of the causal attention backward (kernels/attention.h) on Hopper: wgmma with TMA
// loads and warp specialisation, bf16 in, f32 accumulate, deterministic (each dk and dv element
// summed in one thread's registers in a fixed order and written once, no atomics). The dq pass
// is attention_backward_dq_wgmma.cu; D = rowsum(dO * O) comes from the preprocess
// (attention_backward.cu).
//
// One CTA of three warpgroups per (64-key tile, head), one CTA per SM:
//   producer (warpgroup 0, 32 registers): one thread's TMA loads of K [64][dqk] and V [64][dv]
//     once, then of 64-query tiles Q [64][dqk] and dO [64][dv] into a ring of 4 stages, from the
//     first key (no earlier query sees a key >= k0) to the end of the last key's document
//     (QueryTiles, attention_tc_layout.h); and the column warp, which writes each stage's
//     per-query lse, D and visible-key bounds to shared memory (a stage is full once both did).
//   consumers (warpgroups 1 and 2, 232 registers) split the outputs, not the keys: both own the
//     CTA's 64 keys (the wgmma M) and form S^T = K Q_j^T by wgmma.m64n64k16 (operands from shared
//     memory, K-major), then
//     the dv warpgroup: P^T = exp2(S^T scale log2 e - lse_q log2 e) (0 where masked) and
//       dV += P^T dO_j by wgmma.m64n128k16 with P^T from the registers (bf16) and dO_j read
//       transposed (MN-major descriptor);
//     the dk warpgroup: dP^T = V dO_j^T (m64n64k16), dS^T = P^T (dP^T - D_q) and dK += dS^T Q_j by
//       wgmma.m64n{dqk}k16, Q_j read transposed; dk is scaled by `scale` on store.
//   So S^T is formed twice (one product of 6 more than the minimum), in exchange for accumulators
//   that fit: dK alone is 96 registers a thread at dqk 192, dV 64. As in the forward, a
//   warpgroup issues tile j's scores with tile j - 1's accumulating product and works on the
//   scores while that product runs (except the dk warpgroup at dqk 192: no registers for both,
//   Overlaps); a query stage is released when both warpgroups' products of it have landed.
// Masks per element only on the tiles that cross the diagonal or a document end; keys past n are
// computed on zeros and not written. Shared memory: 64 (dqk + dv) + 4 * 64 (dqk + dv) bf16 and
// 4 KB of query columns = 204 KB at 192/128, 164 KB at 128/128.
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
using attention_tc::DocOf;
using attention_tc::DocStart;
using attention_tc::QueryTiles;
using attention_tc::QueryTileWhollyVisible;
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

constexpr int kKeys = 64;     // keys of a CTA (the wgmma M of both consumers)
constexpr int kQueries = 64;  // queries of a streamed tile (the wgmma N of S^T and dP^T)
constexpr int kStages = 4;
// The producer warpgroup runs the column warp's binary searches too: 32 registers (24 would
// spill), 232 for the consumers (the dk one at dqk 192 needs ~230).
constexpr int kDkDvProducerRegisters = 32, kDkDvConsumerRegisters = 232;
static_assert(RegisterSharesFit(kDkDvProducerRegisters, kDkDvConsumerRegisters));

struct DkDvBarriers {
  uint64_t keys_full;  // K and V
  // A stage is full when its Q and dO landed (the producer's arrival with their bytes) and the
  // column warp wrote its query columns (32 arrivals).
  uint64_t full[kStages], empty[kStages];
  uint32_t stalled;
};
constexpr uint32_t kFullArrivals = 1 + 32;

// Per stage and streamed query c: lse (log2 units), D, and the query's visible keys relative to
// k0, [lo, hi] clamped to [-1, 64] (ClampToTile); written by the column warp.
struct QueryColumns {
  float lse2[kQueries], dsum[kQueries];
  int lo[kQueries], hi[kQueries];
};

// The shared-memory plan: K, V, the ring of (Q, dO) stages, the mbarriers.
template <int kDqk, int kDv>
struct DkDvPlan {
  static_assert(kDqk % 64 == 0 && kDv == 128, "tiles are 64-column blocks; dV's N is 128");
  static constexpr uint32_t kKBytes = kKeys * kDqk * 2;
  static constexpr uint32_t kVBytes = kKeys * kDv * 2;
  static constexpr uint32_t kQBytes = kQueries * kDqk * 2;
  static constexpr uint32_t kDoBytes = kQueries * kDv * 2;
  static constexpr uint32_t kStageBytes = kQBytes + kDoBytes;
  static constexpr uint32_t kV = kKBytes;  // byte offsets, 1024-aligned
  static constexpr uint32_t kRing = kV + kVBytes;
  static constexpr uint32_t kColumns = kRing + kStages * kStageBytes;
  static constexpr uint32_t kBarriers = kColumns + kStages * sizeof(QueryColumns);
  static constexpr size_t kSmemBytes = kBarriers + sizeof(DkDvBarriers) + 1024;
  static_assert(kSmemBytes <= kSharedLimit, "shared memory plan too large");
};

struct DkDvProblem {
  const int64_t* cu;
  int64_t entries, n;
  int heads, k_blocks;
  float scale, scale_log2;
  const float *lse, *dsum;
  bf16 *dk, *dv;
};

// The producer: K and V once, then Q and dO of every query tile into the ring (one thread).
template <int kDqk, int kDv>
__device__ void ProduceDkDv(const CUtensorMap* q_map, const CUtensorMap* do_map,
                            const CUtensorMap* k_map, const CUtensorMap* v_map, unsigned char* smem,
                            DkDvBarriers* bars, int h, int64_t k0, int tiles) {
  using P = DkDvPlan<kDqk, kDv>;
  hopper::TmaPrefetch(q_map);
  hopper::TmaPrefetch(do_map);
  hopper::TmaPrefetch(k_map);
  hopper::TmaPrefetch(v_map);
  const int qk_col = h * kDqk, v_col = h * kDv;
  BarrierArriveExpectTx(&bars->keys_full, P::kKBytes + P::kVBytes);
#pragma unroll
  for (int b = 0; b < kDqk / 64; ++b) {
    hopper::TmaLoad2d(smem + b * kKeys * kRowBytes, k_map, qk_col + 64 * b, static_cast<int>(k0),
                      &bars->keys_full);
  }
#pragma unroll
  for (int b = 0; b < kDv / 64; ++b) {
    hopper::TmaLoad2d(smem + P::kV + b * kKeys * kRowBytes, v_map, v_col + 64 * b,
                      static_cast<int>(k0), &bars->keys_full);
  }
  for (int t = 0; t < tiles; ++t) {
    const int s = t % kStages;
    const uint32_t parity = ((t / kStages) & 1) ^ 1;  // the previous use's release
    const int qb = static_cast<int>(k0 + static_cast<int64_t>(t) * kQueries);
    BarrierWait(&bars->empty[s], parity, &bars->stalled);
    if (Stalled(&bars->stalled)) return;
    BarrierArriveExpectTx(&bars->full[s], P::kStageBytes);
    unsigned char* stage = smem + P::kRing + s * P::kStageBytes;
#pragma unroll
    for (int b = 0; b < kDqk / 64; ++b) {
      hopper::TmaLoad2d(stage + b * kQueries * kRowBytes, q_map, qk_col + 64 * b, qb,
                        &bars->full[s]);
    }
#pragma unroll
    for (int b = 0; b < kDv / 64; ++b) {
      hopper::TmaLoad2d(stage + P::kQBytes + b * kQueries * kRowBytes, do_map, v_col + 64 * b, qb,
                        &bars->full[s]);
    }
  }
}

// The column warp (warp 1 of the producer warpgroup): per query tile, each lane fills two
// streamed queries' entries of the stage's QueryColumns, then arrives on the stage's full barrier.
__device__ void FillColumns(const DkDvProblem& pr, QueryColumns* columns, DkDvBarriers* bars, int h,
                            int64_t k0, int tiles) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (int t = 0; t < tiles; ++t) {
    const int s = t % kStages;
    BarrierWait(&bars->empty[s], ((t / kStages) & 1) ^ 1, &bars->stalled);
    if (Stalled(&bars->stalled)) return;
    const int64_t qb = k0 + static_cast<int64_t>(t) * kQueries;
    for (int c = lane; c < kQueries; c += 32) {
      const int64_t i = qb + c;
      const bool in = i < pr.n;
      columns[s].lse2[c] = in ? pr.lse[i * pr.heads + h] * kLog2e : 0.0f;
      columns[s].dsum[c] = in ? pr.dsum[i * pr.heads + h] : 0.0f;
      // Query i sees keys DocStart(i) .. i; past n none (DocStart(i) = i + 1).
      columns[s].lo[c] = ClampToTile(DocStart(pr.cu, pr.entries, pr.n, i) - k0, kKeys);
      columns[s].hi[c] = ClampToTile(i - k0, kKeys);
    }
    hopper::BarrierArrive(&bars->full[s]);
  }
}

// P^T in place of S^T for the tile at qb (accumulator i: key row key[(i / 2) % 2], query column
// AccCol(lane, i)), 0 for the pairs a mask hides; only a tile that is not wholly visible (every
// query after every key, the last query's document starting at or before k0) is masked.
__device__ __forceinline__ void Probabilities(float (&st)[kQueries / 2], const int (&key)[2],
                                              const QueryColumns& cols, int64_t qb, int64_t k0,
                                              float scale_log2) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const bool masked = !QueryTileWhollyVisible(qb, k0, kKeys, cols.lo[kQueries - 1]);
#pragma unroll
  for (int i = 0; i < kQueries / 2; ++i) {
    const int c = AccCol(lane, i), r = (i / 2) % 2;
    const bool visible = !masked || (cols.lo[c] <= key[r] && key[r] <= cols.hi[c]);
    st[i] = visible ? Exp2(fmaf(st[i], scale_log2, -cols.lse2[c])) : 0.0f;
  }
}

// Issues S^T = K Q^T (and dP^T = V dO^T for the dk warpgroup) against the stage at `stage` (one
// commit group).
template <int kDqk, int kDv, bool kDk>
__device__ __forceinline__ void IssueScores(float (&st)[kQueries / 2], float (&dpt)[kQueries / 2],
                                            uint32_t k_rows, uint32_t v_rows, uint32_t stage) {
  using P = DkDvPlan<kDqk, kDv>;
#pragma unroll
  for (int kk = 0; kk < kDqk / 16; ++kk) {
    hopper::WgmmaM64N64K16SS(st, KMajorDescriptor(k_rows, kKeys * kRowBytes, kk),
                             KMajorDescriptor(stage, kQueries * kRowBytes, kk), kk > 0 ? 1 : 0);
  }
  if constexpr (kDk) {
#pragma unroll
    for (int kk = 0; kk < kDv / 16; ++kk) {
      hopper::WgmmaM64N64K16SS(dpt, KMajorDescriptor(v_rows, kKeys * kRowBytes, kk),
                               KMajorDescriptor(stage + P::kQBytes, kQueries * kRowBytes, kk),
                               kk > 0 ? 1 : 0);
    }
  }
  WgmmaCommit();
}

// Issues the accumulating product of the stage at `stage`: dV += P^T dO (dv warpgroup) or
// dK += dS^T Q (dk warpgroup), the bf16 A operand from registers, B read transposed.
template <int kDqk, int kDv, bool kDk>
__device__ __forceinline__ void IssueAccumulate(float (&acc)[(kDk ? kDqk : kDv) / 2],
                                                const uint32_t (&a_frag)[kQueries / 4],
                                                uint32_t stage) {
  using P = DkDvPlan<kDqk, kDv>;
#pragma unroll
  for (int kk = 0; kk < kQueries / 16; ++kk) {
    const uint32_t a[4] = {a_frag[4 * kk], a_frag[4 * kk + 1], a_frag[4 * kk + 2],
                           a_frag[4 * kk + 3]};
    if constexpr (!kDk) {
      hopper::WgmmaM64N128K16RS(acc, a, MnMajorDescriptor(stage + P::kQBytes, kQueries, kk), 1);
    } else if constexpr (kDqk == 192) {
      hopper::WgmmaM64N192K16RS(acc, a, MnMajorDescriptor(stage, kQueries, kk), 1);
    } else {
      hopper::WgmmaM64N128K16RS(acc, a, MnMajorDescriptor(stage, kQueries, kk), 1);
    }
  }
  WgmmaCommit();
}

// Whether a consumer issues a tile's scores with the previous tile's accumulating product: not the
// dk warpgroup at dqk 192, whose 96 accumulator registers leave no room for both in flight.
template <int kDqk, bool kDk>
constexpr bool Overlaps() {
  return !kDk || kDqk <= 128;
}

// A consumer warpgroup: the dv one (kDk false) or the dk one.
template <int kDqk, int kDv, bool kDk>
__device__ void ConsumeDkDv(const DkDvProblem& pr, unsigned char* smem, DkDvBarriers* bars, int h,
                            int64_t k0, int tiles) {
  const auto* columns = reinterpret_cast<const QueryColumns*>(smem + DkDvPlan<kDqk, kDv>::kColumns);
  using P = DkDvPlan<kDqk, kDv>;
  constexpr int kN = kDk ? kDqk : kDv;  // the accumulator's columns
  const int warp = static_cast<int>(threadIdx.x / 32) % 4;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int key[2] = {16 * warp + lane / 4, 16 * warp + lane / 4 + 8};  // this thread's keys - k0
  const uint32_t k_rows = SmemAddr(smem), v_rows = SmemAddr(smem + P::kV);
  const uint32_t ring = SmemAddr(smem + P::kRing);
  float st[kQueries / 2], dpt[kQueries / 2], acc[kN / 2];
  uint32_t a_frag[kQueries / 4];
#pragma unroll
  for (int i = 0; i < kQueries / 2; ++i) st[i] = dpt[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.0f;
  // P^T (dv) or dS^T (dk) of tile t (stage s) in `st`, from its scores.
  const auto elementwise = [&](int t, int s) {
    const QueryColumns& cols = columns[s];
    Probabilities(st, key, cols, k0 + static_cast<int64_t>(t) * kQueries, k0, pr.scale_log2);
    if constexpr (kDk) {
#pragma unroll
      for (int i = 0; i < kQueries / 2; ++i) st[i] *= dpt[i] - cols.dsum[AccCol(lane, i)];
    }
  };

  BarrierWait(&bars->keys_full, 0, &bars->stalled);
  if constexpr (!Overlaps<kDqk, kDk>()) {
    // One tile at a time: scores, the elementwise step, the accumulating product.
    for (int t = 0; t < tiles; ++t) {
      const int s = t % kStages;
      const uint32_t stage = ring + s * P::kStageBytes;
      BarrierWait(&bars->full[s], (t / kStages) & 1, &bars->stalled);
      FenceRegisters(st);
      FenceRegisters(dpt);
      WgmmaFence();
      IssueScores<kDqk, kDv, kDk>(st, dpt, k_rows, v_rows, stage);
      WgmmaWait<0>();
      FenceRegisters(st);
      FenceRegisters(dpt);
      elementwise(t, s);
      AccumulatorsAsA<kQueries>(a_frag, st);
      FenceRegisters(acc);
      FenceRegisters(a_frag);
      WgmmaFence();
      IssueAccumulate<kDqk, kDv, kDk>(acc, a_frag, stage);
      WgmmaWait<0>();
      FenceRegisters(acc);
      Release(&bars->empty[s]);
    }
  } else {
    // Tile 0: its scores alone.
    BarrierWait(&bars->full[0], 0, &bars->stalled);
    FenceRegisters(st);
    if constexpr (kDk) FenceRegisters(dpt);
    WgmmaFence();
    IssueScores<kDqk, kDv, kDk>(st, dpt, k_rows, v_rows, ring);
    WgmmaWait<0>();
    FenceRegisters(st);
    if constexpr (kDk) FenceRegisters(dpt);
    elementwise(0, 0);
    AccumulatorsAsA<kQueries>(a_frag, st);

    for (int t = 1; t < tiles; ++t) {
      const int s = t % kStages, sp = (t - 1) % kStages;
      const uint32_t stage = ring + s * P::kStageBytes, prev = ring + sp * P::kStageBytes;
      BarrierWait(&bars->full[s], (t / kStages) & 1, &bars->stalled);
      FenceRegisters(st);
      if constexpr (kDk) FenceRegisters(dpt);
      FenceRegisters(acc);
      FenceRegisters(a_frag);
      WgmmaFence();
      IssueScores<kDqk, kDv, kDk>(st, dpt, k_rows, v_rows, stage);
      IssueAccumulate<kDqk, kDv, kDk>(acc, a_frag, prev);
      WgmmaWait<1>();  // tile t's scores landed; tile t - 1's product may still run
      FenceRegisters(st);
      if constexpr (kDk) FenceRegisters(dpt);
      elementwise(t, s);
      WgmmaWait<0>();
      FenceRegisters(acc);
      Release(&bars->empty[sp]);
      AccumulatorsAsA<kQueries>(a_frag, st);
    }
    // The last tile's product.
    const int sl = (tiles - 1) % kStages;
    FenceRegisters(acc);
    FenceRegisters(a_frag);
    WgmmaFence();
    IssueAccumulate<kDqk, kDv, kDk>(acc, a_frag, ring + sl * P::kStageBytes);
    WgmmaWait<0>();
    FenceRegisters(acc);
    Release(&bars->empty[sl]);
  }

  // Rows below n; dk scaled by `scale`; a stalled pipeline poisons them instead of hanging.
  const float out_scale = Stalled(&bars->stalled) ? NAN : (kDk ? pr.scale : 1.0f);
  const int t4 = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = k0 + key[r];
    if (row >= pr.n) continue;
    bf16* out = (kDk ? pr.dk : pr.dv) + row * pr.heads * kN + static_cast<int64_t>(h) * kN + 2 * t4;
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
      *reinterpret_cast<uint32_t*>(out + 8 * j) =
          PackBf16(acc[4 * j + 2 * r] * out_scale, acc[4 * j + 2 * r + 1] * out_scale);
    }
  }
}

template <int kDqk, int kDv>
__global__ void __launch_bounds__(kThreads, 1)
    AttentionDkDvWgmmaKernel(const __grid_constant__ CUtensorMap q_map,
                             const __grid_constant__ CUtensorMap do_map,
                             const __grid_constant__ CUtensorMap k_map,
                             const __grid_constant__ CUtensorMap v_map, DkDvProblem pr) {
  using P = DkDvPlan<kDqk, kDv>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = AlignedShared(smem_raw);
  auto* bars = reinterpret_cast<DkDvBarriers*>(smem + P::kBarriers);

  // In key order: a document's first key tiles stream the most queries, so they start first.
  const int h = static_cast<int>(blockIdx.x % pr.heads);
  const int64_t k0 = static_cast<int64_t>(blockIdx.x / pr.heads) * kKeys;
  const int64_t k_last = (k0 + kKeys < pr.n ? k0 + kKeys : pr.n) - 1;
  // Queries from k0 (none before sees a key >= k0) to the end of the last key's document.
  const int64_t doc_end = pr.cu[DocOf(pr.cu, pr.entries, k_last) + 1];
  const int tiles = QueryTiles(k0, doc_end < pr.n ? doc_end : pr.n, kQueries);
  const int warpgroup = static_cast<int>(threadIdx.x / 128);

  if (threadIdx.x == 0) {
    hopper::BarrierInit(&bars->keys_full, 1);
    for (int s = 0; s < kStages; ++s) {
      hopper::BarrierInit(&bars->full[s], kFullArrivals);
      hopper::BarrierInit(&bars->empty[s], kConsumerWarps);
    }
    bars->stalled = 0;
    hopper::BarrierInitFence();
  }
  __syncthreads();

  if (warpgroup == 0) {
    hopper::RegistersDecrease<kDkDvProducerRegisters>();
    if (threadIdx.x == 0) {
      ProduceDkDv<kDqk, kDv>(&q_map, &do_map, &k_map, &v_map, smem, bars, h, k0, tiles);
    } else if (threadIdx.x / 32 == 1) {
      FillColumns(pr, reinterpret_cast<QueryColumns*>(smem + P::kColumns), bars, h, k0, tiles);
    }
    return;
  }
  hopper::RegistersIncrease<kDkDvConsumerRegisters>();
  if (warpgroup == 1) {
    ConsumeDkDv<kDqk, kDv, false>(pr, smem, bars, h, k0, tiles);
  } else {
    ConsumeDkDv<kDqk, kDv, true>(pr, smem, bars, h, k0, tiles);
  }
}

template <int kDqk, int kDv>
Status DkDv(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
            const Tensor& dsum, const Tensor& d_o, const Tensor& cu, double scale, Tensor* dk,
            Tensor* dv, cudaStream_t stream) {
  const int64_t n = q.dim(0), heads = q.dim(1);
  ORRERY_ASSIGN_OR_RETURN(const CUtensorMap q_map,
                          Bf16TileMap(q.raw_data(), n, heads * kDqk, heads * kDqk, kQueries));
  ORRERY_ASSIGN_OR_RETURN(const CUtensorMap do_map,
                          Bf16TileMap(d_o.raw_data(), n, heads * kDv, heads * kDv, kQueries));
  ORRERY_ASSIGN_OR_RETURN(const CUtensorMap k_map,
                          Bf16TileMap(k.raw_data(), n, heads * kDqk, heads * kDqk, kKeys));
  ORRERY_ASSIGN_OR_RETURN(const CUtensorMap v_map,
                          Bf16TileMap(v.raw_data(), n, heads * kDv, heads * kDv, kKeys));
  DkDvProblem pr;
  pr.cu = cu.data<int64_t>();
  pr.entries = cu.numel();
  pr.n = n;
  pr.heads = static_cast<int>(heads);
  pr.k_blocks = static_cast<int>((n + kKeys - 1) / kKeys);
  pr.scale = static_cast<float>(scale);
  pr.scale_log2 = static_cast<float>(scale) * kLog2e;
  pr.lse = lse.data<float>();
  pr.dsum = dsum.data<float>();
  pr.dk = static_cast<bf16*>(dk->raw_data());
  pr.dv = static_cast<bf16*>(dv->raw_data());
  constexpr size_t kSmem = DkDvPlan<kDqk, kDv>::kSmemBytes;
  auto* kernel = AttentionDkDvWgmmaKernel<kDqk, kDv>;
  ORRERY_RETURN_IF_ERROR(
      CudaStatus(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                 "AttentionDkDvWgmmaKernel shared memory"));
  ORRERY_RETURN_IF_ERROR(CheckLaunchRegisters(kernel, "AttentionDkDvWgmmaKernel"));
  const int64_t blocks = static_cast<int64_t>(pr.k_blocks) * heads;
  kernel<<<static_cast<unsigned>(blocks), kThreads, kSmem, stream>>>(q_map, do_map, k_map, v_map,
                                                                     pr);
  return LastLaunchStatus("AttentionDkDvWgmmaKernel");
}

}  // namespace
}  // namespace attention_wgmma

Status AttentionDkDvWgmma(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                          const Tensor& dsum, const Tensor& d_o, const Tensor& cu_seqlens,
                          double scale, Tensor* dk, Tensor* dv, cudaStream_t stream) {
  if (q.dim(2) == 192) {
    return attention_wgmma::DkDv<192, 128>(q, k, v, lse, dsum, d_o, cu_seqlens, scale, dk, dv,
                                           stream);
  }
  return attention_wgmma::DkDv<128, 128>(q, k, v, lse, dsum, d_o, cu_seqlens, scale, dk, dv,
                                         stream);
}

}  // namespace orrery::kernels::cuda
