// Causal attention forward per document (kernels/attention.h) on Hopper: FlashAttention-3's
// structure (warp specialisation, TMA, wgmma) for the model's head dims, bf16 in, f32 accumulate.
//
// One CTA of three warpgroups per (128-query tile, head), one CTA per SM:
//   producer (warpgroup 0, 24 registers by setmaxnreg; one thread works): TMA loads of the
//     query tile Q [128][dqk] once, then of the key tiles K [128][dqk] and V [128][dv] into a ring
//     of kStages stages (2 at dqk 192, 3 at 128), each tile as 64-column boxes with the 128-byte
//     swizzle (wgmma_layout.h). Every stage has a "full" mbarrier per tensor that the loads
//     complete, and an "empty" one the 8 consumer warps arrive on when done with it.
//   consumers (warpgroups 1 and 2, 240 registers): warpgroup c owns query rows 64 c .. 64 c + 63.
//     Per key tile j: S = Q K^T by 12 (dqk 192) or 8 wgmma.m64n128k16 with both operands from
//     shared memory (K-major descriptors), online softmax on S in registers (log2 domain; a row
//     lives in a quad, max and sum by two shuffles), P rounded to bf16 straight from the S
//     accumulators into A fragments, and O += P V by 8 wgmma.m64n128k16 with A from registers and
//     V [keys][dv] read transposed (MN-major descriptor, imm-trans-b). The two products overlap
//     inside the warpgroup: S_j = Q K_j^T and O += P_{j-1} V_{j-1} are issued together, the
//     softmax of S_j runs while the second still computes, and O is rescaled once it lands
//     (FlashAttention-3's intra-warpgroup overlap). The two consumer warpgroups take turns to
//     issue their products (ping-pong, by a pair of mbarriers: warpgroup 0 issues round r, then
//     warpgroup 1 its round r, then warpgroup 0 round r + 1, ...), so that one's softmax runs
//     while the tensor cores work on the other's products (kPingPong; without it the two issue
//     whenever they are ready).
// Which keys a query row sees is a row map (attention_tc_layout.h), a template argument:
// CausalRows for CausalAttention (keys from the row's document start to itself), PrefixRows for
// PrefixCausalAttention (queries at the end of a longer context, packed apart from the keys). A
// CTA streams keys from its first row's first key to its last row's last; the TMA box is fixed,
// so keys outside a row's range are masked per element, only on the tiles that cross a range's
// end (the diagonal) or start (a document start) (KeyTileWhollyVisible); past the key tensor's
// end TMA reads zeros. CTAs take the query tiles from
// the last to the first, so that the longest start first.
// Shared memory: (128 dqk + kStages 128 (dqk + dv)) bf16 = 208 KB at 192/128, 224 KB at 128/128.
//
// Requires scale > 0 (the running max is kept on raw scores), 16-byte aligned q, k, v and fewer
// than 2^31 - 256 tokens (TMA coordinates are 32-bit): AttentionWgmmaSupported.
// Measured time: not yet timed on the H200 (tests/gpu/attention_gpu_bench.cc).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

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
using attention_tc::KeyTiles;
using attention_tc::KeyTileWhollyVisible;
using hopper::BarrierArrive;
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
constexpr int kBlockN = 128;  // keys of a streamed tile (the wgmma N of S)

// The shared-memory plan of a head-dim pair: Q, the K ring, the V ring, the mbarriers.
template <int kDqk, int kDv>
struct Plan {
  static_assert(kDqk % 64 == 0 && kDv == 128, "wgmma N of O is 128; tiles are 64-column blocks");
  static constexpr uint32_t kQBytes = kBlockM * kDqk * 2;
  static constexpr uint32_t kKBytes = kBlockN * kDqk * 2;
  static constexpr uint32_t kVBytes = kBlockN * kDv * 2;
  static constexpr int kStages =
      kQBytes + 3 * (kKBytes + kVBytes) + 1024 + 256 <= kSharedLimit ? 3 : 2;
  static constexpr uint32_t kK = kQBytes;  // byte offsets, 1024-aligned
  static constexpr uint32_t kV = kK + kStages * kKBytes;
  static constexpr uint32_t kBarriers = kV + kStages * kVBytes;
  static constexpr size_t kSmemBytes = kBarriers + (4 + 4 * kStages) * 8 + 1024;  // + alignment
  static_assert(kSmemBytes <= kSharedLimit, "shared memory plan too large");
};

template <int kStages>
struct Barriers {
  uint64_t q_full;
  uint64_t k_full[kStages], k_empty[kStages];
  uint64_t v_full[kStages], v_empty[kStages];
  uint64_t turn[2];  // ping-pong: consumer c may issue its next products when turn[c] completes
  uint32_t stalled;  // set by a wait that gave up (hopper::BarrierWait): outputs become NaN
};

// Rows: which keys each query row sees (attention_tc_layout.h: CausalRows for CausalAttention,
// PrefixRows for PrefixCausalAttention); n query rows.
template <class Rows>
struct Problem {
  Rows rows;
  int64_t n;
  int heads, m_blocks;
  float scale_log2;
  bf16* o;
  float* lse;
};

// The producer: Q once, then K and V of every tile into the ring (one thread).
template <int kDqk, int kDv, int kStages>
__device__ void Produce(const CUtensorMap* q_map, const CUtensorMap* k_map,
                        const CUtensorMap* v_map, unsigned char* smem, Barriers<kStages>* bars,
                        int h, int64_t q0, int64_t kv_begin, int tiles) {
  using P = Plan<kDqk, kDv>;
  hopper::TmaPrefetch(q_map);
  hopper::TmaPrefetch(k_map);
  hopper::TmaPrefetch(v_map);
  const int qk_col = h * kDqk, v_col = h * kDv;
  BarrierArriveExpectTx(&bars->q_full, P::kQBytes);
#pragma unroll
  for (int b = 0; b < kDqk / 64; ++b) {
    hopper::TmaLoad2d(smem + b * kBlockM * kRowBytes, q_map, qk_col + 64 * b, static_cast<int>(q0),
                      &bars->q_full);
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

// A consumer warpgroup's rows of the online softmax over one key tile.
struct SoftmaxRows {
  int64_t row[2];            // this thread's rows (accumulator rows g, g + 8)
  int64_t start[2], end[2];  // the keys each sees: start .. end (Rows::First, Rows::Last)
  float m[2], l[2];          // running max of the raw scores, this thread's part of the sums
  float scale_log2;

  // s (the tile's scores, S accumulators) becomes p = exp2(s scale_log2 - max) with the masked
  // pairs 0; returns in alpha the factor that rescales the rows' earlier output.
  __device__ __forceinline__ void Step(float (&s)[64], int64_t kb, bool masked, float (&alpha)[2]) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    if (masked) {
      // Key kb + c is visible to row r when start[r] <= kb + c <= end[r].
      const int lo[2] = {ClampToTile(start[0] - kb, kBlockN), ClampToTile(start[1] - kb, kBlockN)};
      const int hi[2] = {ClampToTile(end[0] - kb, kBlockN), ClampToTile(end[1] - kb, kBlockN)};
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        const int c = AccCol(lane, i), r = (i / 2) % 2;
        if (c < lo[r] || c > hi[r]) s[i] = -INFINITY;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = m[r];
#pragma unroll
      for (int i = 2 * r; i < 64; i += 4) mx = fmaxf(mx, fmaxf(s[i], s[i + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row with no visible key yet keeps m = -inf and uses 0 as its reference (p = 0 and
      // alpha = 0 instead of NaN).
      const float ref = mx == -INFINITY ? 0.0f : mx * scale_log2;
      alpha[r] = Exp2(m[r] * scale_log2 - ref);
      m[r] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int i = 2 * r; i < 64; i += 4) {
        s[i] = Exp2(fmaf(s[i], scale_log2, -ref));
        s[i + 1] = Exp2(fmaf(s[i + 1], scale_log2, -ref));
        sum += s[i] + s[i + 1];
      }
      l[r] = l[r] * alpha[r] + sum;
    }
  }
};

// Issues S = Q K^T for the consumer's 64 rows against the K tile at k_tile (one commit group).
template <int kDqk>
__device__ __forceinline__ void IssueQK(float (&s)[64], uint32_t q_rows, uint32_t k_tile) {
#pragma unroll
  for (int kk = 0; kk < kDqk / 16; ++kk) {
    hopper::WgmmaM64N128K16SS(s, KMajorDescriptor(q_rows, kBlockM * kRowBytes, kk),
                              KMajorDescriptor(k_tile, kBlockN * kRowBytes, kk), kk > 0 ? 1 : 0);
  }
  WgmmaCommit();
}

// Issues O += P V against the V tile at v_tile (one commit group).
__device__ __forceinline__ void IssuePV(float (&o)[64], const uint32_t (&p)[32], uint32_t v_tile) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
    hopper::WgmmaM64N128K16RS(o, a, MnMajorDescriptor(v_tile, kBlockN, kk), 1);
  }
  WgmmaCommit();
}

template <int kDqk, int kDv, bool kPingPong, class Rows>
__global__ void __launch_bounds__(kThreads, 1)
    AttentionForwardWgmmaKernel(const __grid_constant__ CUtensorMap q_map,
                                const __grid_constant__ CUtensorMap k_map,
                                const __grid_constant__ CUtensorMap v_map, Problem<Rows> pr) {
  using P = Plan<kDqk, kDv>;
  constexpr int kStages = P::kStages;
  extern __shared__ unsigned char smem_raw[];
  // The tiles need 1024-byte aligned shared addresses (the swizzle atom).
  unsigned char* smem = AlignedShared(smem_raw);
  auto* bars = reinterpret_cast<Barriers<kStages>*>(smem + P::kBarriers);

  const int h = static_cast<int>(blockIdx.x % pr.heads);
  const int64_t q0 =
      static_cast<int64_t>(pr.m_blocks - 1 - static_cast<int>(blockIdx.x / pr.heads)) * kBlockM;
  const int64_t q_last = (q0 + kBlockM < pr.n ? q0 + kBlockM : pr.n) - 1;
  // Keys First(q0) .. Last(q_last): every one is seen by some row of the CTA (causal; PrefixRows
  // may stream a masked tile, attention_tc_layout.h). At most 0 tiles only where no row sees a
  // key (PrefixRows with more queries than keys: o = 0, lse = -inf).
  const int64_t kv_begin = pr.rows.First(q0);
  const int tiles = KeyTiles(kv_begin, pr.rows.Last(q_last), kBlockN);
  const int warpgroup = static_cast<int>(threadIdx.x / 128);

  if (threadIdx.x == 0) {
    hopper::BarrierInit(&bars->q_full, 1);
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
      Produce<kDqk, kDv, kStages>(&q_map, &k_map, &v_map, smem, bars, h, q0, kv_begin, tiles);
    }
    return;
  }
  hopper::RegistersIncrease<kConsumerRegisters>();

  const int consumer = warpgroup - 1;
  const int warp = static_cast<int>(threadIdx.x / 32) % 4,
            lane = static_cast<int>(threadIdx.x % 32);
  // A tile is wholly visible when its keys lie in [First(q_last), Last(q0)] (the latest start, the
  // earliest end).
  const int64_t last_start = pr.rows.First(q_last), first_end = pr.rows.Last(q0);
  SoftmaxRows rows;
  rows.row[0] = q0 + consumer * kConsumerRows + 16 * warp + lane / 4;
  rows.row[1] = rows.row[0] + 8;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    rows.start[r] = pr.rows.First(rows.row[r]);
    rows.end[r] = pr.rows.Last(rows.row[r]);
  }
  rows.m[0] = rows.m[1] = -INFINITY;
  rows.l[0] = rows.l[1] = 0.0f;
  rows.scale_log2 = pr.scale_log2;

  const uint32_t q_rows = SmemAddr(smem) + consumer * kConsumerRows * kRowBytes;
  const uint32_t k_ring = SmemAddr(smem + P::kK), v_ring = SmemAddr(smem + P::kV);
  float o[64], s[64], alpha[2];
  uint32_t p[32];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = s[i] = 0.0f;

  Turns<kPingPong> turns{bars->turn, &bars->stalled, consumer};
  turns.Start();
  BarrierWait(&bars->q_full, 0, &bars->stalled);
  if (tiles > 0) {
    // Tile 0: S_0 alone (there is no P yet).
    BarrierWait(&bars->k_full[0], 0, &bars->stalled);
    turns.Take();
    FenceRegisters(s);
    WgmmaFence();
    IssueQK<kDqk>(s, q_rows, k_ring);
    turns.Pass();
    WgmmaWait<0>();
    FenceRegisters(s);
    Release(&bars->k_empty[0]);
    rows.Step(s, kv_begin, !KeyTileWhollyVisible(kv_begin, kBlockN, first_end, last_start), alpha);
    AccumulatorsAsA<kBlockN>(p, s);

    for (int t = 1; t < tiles; ++t) {
      const int st = t % kStages, sp = (t - 1) % kStages;
      const int64_t kb = kv_begin + static_cast<int64_t>(t) * kBlockN;
      // Both waits before the fence: no branch between it and the two products (V_{t-1} came
      // with K_{t-1}, so the second wait is rarely a wait).
      BarrierWait(&bars->k_full[st], (t / kStages) & 1, &bars->stalled);
      BarrierWait(&bars->v_full[sp], ((t - 1) / kStages) & 1, &bars->stalled);
      turns.Take();
      FenceRegisters(s);
      FenceRegisters(p);
      FenceRegisters(o);
      WgmmaFence();
      IssueQK<kDqk>(s, q_rows, k_ring + st * P::kKBytes);
      IssuePV(o, p, v_ring + sp * P::kVBytes);
      turns.Pass();
      WgmmaWait<1>();  // S_t landed; P_{t-1} V_{t-1} may still run
      FenceRegisters(s);
      Release(&bars->k_empty[st]);
      rows.Step(s, kb, !KeyTileWhollyVisible(kb, kBlockN, first_end, last_start), alpha);
      WgmmaWait<0>();
      FenceRegisters(o);
      Release(&bars->v_empty[sp]);
#pragma unroll
      for (int i = 0; i < 64; ++i) o[i] *= alpha[(i / 2) % 2];
      AccumulatorsAsA<kBlockN>(p, s);
    }
    // The last tile's P V.
    const int sl = (tiles - 1) % kStages;
    BarrierWait(&bars->v_full[sl], ((tiles - 1) / kStages) & 1, &bars->stalled);
    turns.Take();
    FenceRegisters(p);
    FenceRegisters(o);
    WgmmaFence();
    IssuePV(o, p, v_ring + sl * P::kVBytes);
    turns.Pass();
    WgmmaWait<0>();
    FenceRegisters(o);
    Release(&bars->v_empty[sl]);
  }

  // o = O / l, lse = (m scale_log2 + log2 l) ln 2 for the rows below n (a row's sum over its
  // quad by two shuffles; > 0 since every row sees its own key).
  // A stalled pipeline (hopper::BarrierWait) poisons the rows instead of hanging.
  const bool poisoned = Stalled(&bars->stalled);
  const int t4 = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = rows.l[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int64_t row = rows.row[r];
    if (row > q_last) continue;
    // sum > 0: every row sees a key (its own; PrefixRows: when n_d <= L_d, else o = 0, lse = -inf).
    const float inv = poisoned ? NAN : (sum > 0.0f ? 1.0f / sum : 0.0f);
    bf16* orow = pr.o + row * pr.heads * kDv + static_cast<int64_t>(h) * kDv + 2 * t4;
#pragma unroll
    for (int j = 0; j < kDv / 8; ++j) {
      *reinterpret_cast<uint32_t*>(orow + 8 * j) =
          PackBf16(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    }
    if (t4 == 0) {
      pr.lse[row * pr.heads + h] =
          poisoned ? NAN
                   : (sum > 0.0f ? (rows.m[r] * pr.scale_log2 + log2f(sum)) * kLn2 : -INFINITY);
    }
  }
}

template <int kDqk, int kDv, bool kPingPong, class Rows>
Status Forward(const Tensor& q, const Tensor& k, const Tensor& v, const Rows& rows, double scale,
               Tensor* o, Tensor* lse, cudaStream_t stream) {
  const int64_t n = q.dim(0), nk = k.dim(0), heads = q.dim(1);
  ORRERY_ASSIGN_OR_RETURN(const CUtensorMap q_map,
                          Bf16TileMap(q.raw_data(), n, heads * kDqk, heads * kDqk, kBlockM));
  ORRERY_ASSIGN_OR_RETURN(const CUtensorMap k_map,
                          Bf16TileMap(k.raw_data(), nk, heads * kDqk, heads * kDqk, kBlockN));
  ORRERY_ASSIGN_OR_RETURN(const CUtensorMap v_map,
                          Bf16TileMap(v.raw_data(), nk, heads * kDv, heads * kDv, kBlockN));
  Problem<Rows> pr;
  pr.rows = rows;
  pr.n = n;
  pr.heads = static_cast<int>(heads);
  pr.m_blocks = static_cast<int>((n + kBlockM - 1) / kBlockM);
  pr.scale_log2 = static_cast<float>(scale) * kLog2e;
  pr.o = static_cast<bf16*>(o->raw_data());
  pr.lse = lse->data<float>();
  constexpr size_t kSmem = Plan<kDqk, kDv>::kSmemBytes;
  auto* kernel = AttentionForwardWgmmaKernel<kDqk, kDv, kPingPong, Rows>;
  ORRERY_RETURN_IF_ERROR(
      CudaStatus(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                 "AttentionForwardWgmmaKernel shared memory"));
  ORRERY_RETURN_IF_ERROR(CheckLaunchRegisters(kernel, "AttentionForwardWgmmaKernel"));
  const int64_t blocks = static_cast<int64_t>(pr.m_blocks) * heads;
  kernel<<<static_cast<unsigned>(blocks), kThreads, kSmem, stream>>>(q_map, k_map, v_map, pr);
  return LastLaunchStatus("AttentionForwardWgmmaKernel");
}

template <bool kPingPong, class Rows>
Status ForwardDims(const Tensor& q, const Tensor& k, const Tensor& v, const Rows& rows,
                   double scale, Tensor* o, Tensor* lse, cudaStream_t stream) {
  if (q.dim(2) == 192) return Forward<192, 128, kPingPong>(q, k, v, rows, scale, o, lse, stream);
  return Forward<128, 128, kPingPong>(q, k, v, rows, scale, o, lse, stream);
}

}  // namespace
}  // namespace attention_wgmma

bool AttentionWgmmaSupported(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  const int64_t dqk = q.dim(2), dv = v.dim(2);
  if (q.dtype() != DType::kBF16 || dv != 128 || (dqk != 192 && dqk != 128)) return false;
  if (!(scale > 0.0) || !std::isfinite(scale)) return false;
  constexpr int64_t kMaxTokens = (int64_t{1} << 31) - 256;  // 32-bit TMA coordinates
  if (q.dim(0) >= kMaxTokens || k.dim(0) >= kMaxTokens || k.dim(0) < 1) return false;
  for (const Tensor* t : {&q, &k, &v}) {
    if (reinterpret_cast<uintptr_t>(t->raw_data()) % 16 != 0) return false;
  }
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, q.device().index) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, q.device().index) !=
          cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major == 9 && minor == 0;
}

Status AttentionForwardWgmma(const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& cu_seqlens, double scale, Tensor* o, Tensor* lse,
                             cudaStream_t stream, bool ping_pong) {
  using attention_wgmma::ForwardDims;
  const attention_tc::CausalRows rows{cu_seqlens.data<int64_t>(), cu_seqlens.numel(), q.dim(0)};
  return ping_pong ? ForwardDims<true>(q, k, v, rows, scale, o, lse, stream)
                   : ForwardDims<false>(q, k, v, rows, scale, o, lse, stream);
}

Status PrefixAttentionForwardWgmma(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& cu_q, const Tensor& cu_k, double scale, Tensor* o,
                                   Tensor* lse, cudaStream_t stream) {
  const attention_tc::PrefixRows rows{cu_q.data<int64_t>(), cu_k.data<int64_t>(), cu_q.numel(),
                                      q.dim(0)};
  return attention_wgmma::ForwardDims<true>(q, k, v, rows, scale, o, lse, stream);
}

}  // namespace orrery::kernels::cuda
