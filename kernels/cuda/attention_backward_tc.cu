// Causal attention backward per document (kernels/attention.h) on tensor cores: FlashAttention-2
// structure on bf16 `mma.sync.m16n8k16` with f32 accumulation, deterministic (no atomics: each
// output element is summed in one thread's registers and written once). After the preprocess
// D = rowsum(dO * O) (AttentionRowDotKernel, attention_backward.cu) two kernels:
//
// AttentionDkDvTcKernel: one block of 4 warps per (64-key tile, head); warp w owns keys
//   16 w .. 16 w + 15. The block streams 32-query tiles of Q [32][dqk] and dO [32][dv] (with each
//   query's lse, D and document bounds) from its first key to the end of its last key's document,
//   two cp.async stages. Per tile each warp forms S^T = K Q^T and dP^T = V dO^T (16 x 32), then
//   P^T = exp2(S^T scale log2 e - lse log2 e) and dS^T = P^T (dP^T - D) in registers, and adds
//   dV += P^T dO and dK += dS^T Q (P^T and dS^T rounded to bf16 straight from the accumulators
//   into A fragments; dO and Q by ldmatrix.trans as row-major B operands). dK is scaled on store.
// AttentionDqTcKernel: one block per (64-query tile, head), warp w owning query rows 16 w ..;
//   streams 32-key tiles of K and V as the forward does (from its first query's document start)
//   and adds dQ += dS K, recomputing S = Q K^T and dP = dO V^T (7 tile products per score in all
//   instead of 5, the price of writing dQ once in bf16 without atomics).
// Both mask per element only the tiles that cross the causal diagonal or a document start, and a
// warp skips a tile none of its rows sees. The blocks with the longest streams start first
// (dk/dv: in key order; dq: from the last query tile down). Tiles are bf16 with swizzled rows
// (attention_tc_tiles.cuh). Shared memory: 64 (dqk + dv) + 2 * 32 (dqk + dv) bf16 = 80 KB at
// 192/128 for either kernel, two blocks per SM.
//
// Head dims are template arguments: (192, 128) and (128, 128) (AttentionTcSupported).
// Measured time: not yet timed on the H200 (tests/gpu/attention_gpu_bench.cc).
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/attention_tc_tiles.cuh"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/kda_mma.cuh"

namespace orrery::kernels::cuda {
namespace attention_tc {
namespace {

constexpr int kStream = 32;  // rows of a streamed tile (queries for dk/dv, keys for dq)

template <int kDqk, int kDv>
constexpr size_t BackwardSharedBytes() {
  // + the dk/dv kernel's per-query arrays: lse, D (f32) and the visible-key bounds (int), 2 stages.
  return sizeof(bf16) * (kBlockRows + 2 * kStream) * (kDqk + kDv) + 2 * kStream * 16;
}

struct BackwardArgs {
  const bf16 *q, *k, *v, *d_o;
  const float *lse, *dsum;
  const int64_t* cu;
  int64_t entries, n;
  int heads;
  float scale, scale_log2;
  bf16 *dq, *dk, *dv;
};

template <int kDqk, int kDv>
__global__ void __launch_bounds__(kThreads, 2) AttentionDkDvTcKernel(BackwardArgs p) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);  // [64][dqk]
  bf16* vs = ks + kBlockRows * kDqk;         // [64][dv]
  bf16* qs = vs + kBlockRows * kDv;          // [2][32][dqk]
  bf16* dos = qs + 2 * kStream * kDqk;       // [2][32][dv]
  // Per stage and streamed query: lse (log2 units) and D, and the query's visible keys relative
  // to k0, [q_lo, q_hi] clamped to [-1, 64] (ClampToTile). After the tiles, so that the tiles
  // start the dynamic shared memory 128-byte aligned (FragmentAddress).
  auto* q_lse2 = reinterpret_cast<float(*)[kStream]>(dos + 2 * kStream * kDv);
  auto* q_dsum = q_lse2 + 2;
  auto* q_lo = reinterpret_cast<int(*)[kStream]>(q_dsum + 2);
  auto* q_hi = q_lo + 2;
  const int h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t n = p.n;
  // In key order: a document's first key tiles stream the most queries, so they start first.
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kBlockRows;
  const int64_t k_last = (k0 + kBlockRows < n ? k0 + kBlockRows : n) - 1;
  const int64_t qk_stride = static_cast<int64_t>(p.heads) * kDqk;
  const int64_t v_stride = static_cast<int64_t>(p.heads) * kDv;
  // Queries from k0 (none before sees a key >= k0) to the end of the last key's document.
  const int64_t doc_end = p.cu[DocOf(p.cu, p.entries, k_last) + 1];
  const int64_t q_stop = doc_end < n ? doc_end : n;
  const int tiles = QueryTiles(k0, q_stop, kStream);

  // Stage `buf` for the query tile at qb: cp.async copies of Q and dO, plain loads of the rest.
  const auto load_stage = [&](int buf, int64_t qb) {
    LoadTileAsync<kStream, kDqk>(qs + buf * kStream * kDqk, p.q, qb, n, qk_stride, h);
    LoadTileAsync<kStream, kDv>(dos + buf * kStream * kDv, p.d_o, qb, n, v_stride, h);
    if (threadIdx.x < kStream) {
      const int64_t i = qb + threadIdx.x;
      const bool in = i < n;
      q_lse2[buf][threadIdx.x] = in ? p.lse[i * p.heads + h] * kLog2e : 0.0f;
      q_dsum[buf][threadIdx.x] = in ? p.dsum[i * p.heads + h] : 0.0f;
      // Query i sees keys DocStart(i) .. i; past n none (DocStart(i) = i + 1).
      q_lo[buf][threadIdx.x] = ClampToTile(DocStart(p.cu, p.entries, n, i) - k0, kBlockRows);
      q_hi[buf][threadIdx.x] = ClampToTile(i - k0, kBlockRows);
    }
  };

  LoadTileAsync<kBlockRows, kDqk>(ks, p.k, k0, n, qk_stride, h);
  LoadTileAsync<kBlockRows, kDv>(vs, p.v, k0, n, v_stride, h);
  load_stage(0, k0);
  CpAsyncCommit();

  float adk[kDqk / 8][4], adv[kDv / 8][4];  // rows (keys) g, g + 8 of the warp; m16n8 tiles
#pragma unroll
  for (int j = 0; j < kDqk / 8; ++j) adk[j][0] = adk[j][1] = adk[j][2] = adk[j][3] = 0.0f;
#pragma unroll
  for (int j = 0; j < kDv / 8; ++j) adv[j][0] = adv[j][1] = adv[j][2] = adv[j][3] = 0.0f;
  const int key0 = warp * kRowsPerWarp + g, key1 = key0 + 8;  // this lane's keys - k0
  // ldmatrix lane bases (FragmentAddress): K and V as A operands (row order); stage 0 of Q and
  // dO as "col" B operands of S^T and dP^T (column order) and as B operands by .trans of dK and
  // dV (row order).
  const uint32_t k_row = LaneBase(ks, kDqk, true), v_row = LaneBase(vs, kDv, true);
  const uint32_t q_col0 = LaneBase(qs, kDqk, false), q_row0 = LaneBase(qs, kDqk, true);
  const uint32_t do_col0 = LaneBase(dos, kDv, false), do_row0 = LaneBase(dos, kDv, true);

  for (int it = 0; it < tiles; ++it) {
    const int64_t qb = k0 + static_cast<int64_t>(it) * kStream;
    const int buf = it & 1;
    if (it + 1 < tiles) load_stage(buf ^ 1, qb + kStream);
    CpAsyncCommit();          // (empty on the last tile: keeps the wait below uniform)
    CpAsyncWaitPending<1>();  // stage it landed for this thread's copies
    __syncthreads();          // ... and for everyone's (and the plain stores of its arrays)
    // ldmatrix lane bases of this stage's Q and dO tiles, in both orders.
    const uint32_t q_col = q_col0 + buf * kStream * kDqk * 2;
    const uint32_t q_row = q_row0 + buf * kStream * kDqk * 2;
    const uint32_t do_col = do_col0 + buf * kStream * kDv * 2;
    const uint32_t do_row = do_row0 + buf * kStream * kDv * 2;

    // Warp-uniform: all queries before the warp's first key, or the first query's document
    // (the earliest start) begins after the warp's last key.
    if (WarpSeesQueryTile(qb, kStream, k0, warp * kRowsPerWarp, q_lo[buf][0])) {
      // S^T = K Q^T and dP^T = V dO^T: st[j], dpt[j] hold queries qb + 8 j .. + 7 (columns 2t,
      // 2t + 1) of the warp's key rows g and g + 8.
      float st[kStream / 8][4], dpt[kStream / 8][4];
#pragma unroll
      for (int j = 0; j < kStream / 8; ++j) {
        st[j][0] = st[j][1] = st[j][2] = st[j][3] = 0.0f;
        dpt[j][0] = dpt[j][1] = dpt[j][2] = dpt[j][3] = 0.0f;
      }
#pragma unroll
      for (int kk = 0; kk < kDqk / 16; ++kk) {
        uint32_t a[4];
        LoadFragA(a, k_row, kDqk, warp * kRowsPerWarp, kk * 16);
#pragma unroll
        for (int nn = 0; nn < kStream / 16; ++nn) {
          uint32_t b[4];
          LoadFragBT2(b, q_col, kDqk, nn * 16, kk * 16);
          MmaPair(st[2 * nn], st[2 * nn + 1], a, b);
        }
      }
#pragma unroll
      for (int kk = 0; kk < kDv / 16; ++kk) {
        uint32_t a[4];
        LoadFragA(a, v_row, kDv, warp * kRowsPerWarp, kk * 16);
#pragma unroll
        for (int nn = 0; nn < kStream / 16; ++nn) {
          uint32_t b[4];
          LoadFragBT2(b, do_col, kDv, nn * 16, kk * 16);
          MmaPair(dpt[2 * nn], dpt[2 * nn + 1], a, b);
        }
      }
      // P^T and dS^T in place of S^T and dP^T; element e of st[j] is key row (e < 2 ? key0 :
      // key1), query column c = 8 j + 2t + (e & 1).
      // Wholly visible when every query follows every key (qb >= k0 + 63) and the last query's
      // document (the latest start; past n, DocStart(i) = i + 1 > k0) starts at or before k0.
      const bool masked = !QueryTileWhollyVisible(qb, k0, kBlockRows, q_lo[buf][kStream - 1]);
#pragma unroll
      for (int j = 0; j < kStream / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = 8 * j + 2 * t + (e & 1);
          const int key = e < 2 ? key0 : key1;
          const bool visible = !masked || (q_lo[buf][c] <= key && key <= q_hi[buf][c]);
          const float pr = visible ? exp2f(st[j][e] * p.scale_log2 - q_lse2[buf][c]) : 0.0f;
          st[j][e] = pr;
          dpt[j][e] = pr * (dpt[j][e] - q_dsum[buf][c]);
        }
      }
      // dV += P^T dO and dK += dS^T Q over the tile's 32 queries (two k-steps of 16).
#pragma unroll
      for (int kk = 0; kk < kStream / 16; ++kk) {
        uint32_t a[4];
        AccumulatorsAsA(a, st[2 * kk], st[2 * kk + 1]);
#pragma unroll
        for (int nn = 0; nn < kDv / 16; ++nn) {
          uint32_t b[4];
          LoadFragB2(b, do_row, kDv, kk * 16, nn * 16);
          MmaPair(adv[2 * nn], adv[2 * nn + 1], a, b);
        }
        AccumulatorsAsA(a, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
        for (int nn = 0; nn < kDqk / 16; ++nn) {
          uint32_t b[4];
          LoadFragB2(b, q_row, kDqk, kk * 16, nn * 16);
          MmaPair(adk[2 * nn], adk[2 * nn + 1], a, b);
        }
      }
    }
    __syncthreads();  // every warp is done with stage `buf` before it is refilled
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t key = k0 + (r == 0 ? key0 : key1);
    if (key > k_last) continue;
    bf16* dkrow = p.dk + key * qk_stride + static_cast<int64_t>(h) * kDqk + 2 * t;
    bf16* dvrow = p.dv + key * v_stride + static_cast<int64_t>(h) * kDv + 2 * t;
#pragma unroll
    for (int j = 0; j < kDqk / 8; ++j) {
      *reinterpret_cast<uint32_t*>(dkrow + 8 * j) =
          PackBf16(adk[j][2 * r] * p.scale, adk[j][2 * r + 1] * p.scale);
    }
#pragma unroll
    for (int j = 0; j < kDv / 8; ++j) {
      *reinterpret_cast<uint32_t*>(dvrow + 8 * j) = PackBf16(adv[j][2 * r], adv[j][2 * r + 1]);
    }
  }
}

template <int kDqk, int kDv>
__global__ void __launch_bounds__(kThreads, 2) AttentionDqTcKernel(BackwardArgs p) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);  // [64][dqk]
  bf16* dos = qs + kBlockRows * kDqk;        // [64][dv]
  bf16* ks = dos + kBlockRows * kDv;         // [2][32][dqk]
  bf16* vs = ks + 2 * kStream * kDqk;        // [2][32][dv]
  const int h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t n = p.n;
  const int64_t q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kBlockRows;
  const int64_t q_last = (q0 + kBlockRows < n ? q0 + kBlockRows : n) - 1;
  const int64_t qk_stride = static_cast<int64_t>(p.heads) * kDqk;
  const int64_t v_stride = static_cast<int64_t>(p.heads) * kDv;

  // As in the forward: keys from the first query's document start to the last query.
  const int64_t kv_begin = DocStart(p.cu, p.entries, n, q0);
  const int64_t last_start = DocStart(p.cu, p.entries, n, q_last);
  const int64_t row0 = q0 + warp * kRowsPerWarp + g, row1 = row0 + 8;
  const int64_t start0 = DocStart(p.cu, p.entries, n, row0);
  const int64_t start1 = DocStart(p.cu, p.entries, n, row1);
  const int64_t warp_first = q0 + warp * kRowsPerWarp;
  const int64_t warp_last =
      warp_first + kRowsPerWarp - 1 < q_last ? warp_first + kRowsPerWarp - 1 : q_last;
  const int64_t warp_start = DocStart(p.cu, p.entries, n, warp_first);
  const int tiles = KeyTiles(kv_begin, q_last, kStream);
  float lse2[2], dsum[2];  // rows past n: 0 (they see no key)
  lse2[0] = row0 < n ? p.lse[row0 * p.heads + h] * kLog2e : 0.0f;
  lse2[1] = row1 < n ? p.lse[row1 * p.heads + h] * kLog2e : 0.0f;
  dsum[0] = row0 < n ? p.dsum[row0 * p.heads + h] : 0.0f;
  dsum[1] = row1 < n ? p.dsum[row1 * p.heads + h] : 0.0f;

  LoadTileAsync<kBlockRows, kDqk>(qs, p.q, q0, n, qk_stride, h);
  LoadTileAsync<kBlockRows, kDv>(dos, p.d_o, q0, n, v_stride, h);
  LoadTileAsync<kStream, kDqk>(ks, p.k, kv_begin, n, qk_stride, h);
  LoadTileAsync<kStream, kDv>(vs, p.v, kv_begin, n, v_stride, h);
  CpAsyncCommit();

  // ldmatrix lane bases: Q and dO as A operands (row order); stage 0 of K and V as "col" B
  // operands of S and dP (column order), K as the B operand by .trans of dQ (row order).
  const uint32_t q_row = LaneBase(qs, kDqk, true), do_row = LaneBase(dos, kDv, true);
  const uint32_t k_col0 = LaneBase(ks, kDqk, false), k_row0 = LaneBase(ks, kDqk, true);
  const uint32_t v_col0 = LaneBase(vs, kDv, false);
  float acc[kDqk / 8][4];  // dQ rows g, g + 8 of the warp
#pragma unroll
  for (int j = 0; j < kDqk / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  for (int it = 0; it < tiles; ++it) {
    const int64_t kb = kv_begin + static_cast<int64_t>(it) * kStream;
    const int buf = it & 1;
    if (it + 1 < tiles) {
      LoadTileAsync<kStream, kDqk>(ks + (buf ^ 1) * kStream * kDqk, p.k, kb + kStream, n, qk_stride,
                                   h);
      LoadTileAsync<kStream, kDv>(vs + (buf ^ 1) * kStream * kDv, p.v, kb + kStream, n, v_stride,
                                  h);
    }
    CpAsyncCommit();
    CpAsyncWaitPending<1>();
    __syncthreads();
    const uint32_t k_col = k_col0 + buf * kStream * kDqk * 2;
    const uint32_t k_row = k_row0 + buf * kStream * kDqk * 2;
    const uint32_t v_col = v_col0 + buf * kStream * kDv * 2;

    if (WarpSeesKeyTile(kb, kStream, warp_start, warp_last)) {
      // S = Q K^T, dP = dO V^T: s[j], dp[j] hold keys kb + 8 j .. + 7 of rows g, g + 8.
      float s[kStream / 8][4], dp[kStream / 8][4];
#pragma unroll
      for (int j = 0; j < kStream / 8; ++j) {
        s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.0f;
      }
#pragma unroll
      for (int kk = 0; kk < kDqk / 16; ++kk) {
        uint32_t a[4];
        LoadFragA(a, q_row, kDqk, warp * kRowsPerWarp, kk * 16);
#pragma unroll
        for (int nn = 0; nn < kStream / 16; ++nn) {
          uint32_t b[4];
          LoadFragBT2(b, k_col, kDqk, nn * 16, kk * 16);
          MmaPair(s[2 * nn], s[2 * nn + 1], a, b);
        }
      }
#pragma unroll
      for (int kk = 0; kk < kDv / 16; ++kk) {
        uint32_t a[4];
        LoadFragA(a, do_row, kDv, warp * kRowsPerWarp, kk * 16);
#pragma unroll
        for (int nn = 0; nn < kStream / 16; ++nn) {
          uint32_t b[4];
          LoadFragBT2(b, v_col, kDv, nn * 16, kk * 16);
          MmaPair(dp[2 * nn], dp[2 * nn + 1], a, b);
        }
      }
      // P and dS in place; the visible keys of row r relative to kb are [lo[r], hi[r]].
      const bool masked = !KeyTileWhollyVisible(kb, kStream, q0, last_start);
      const int lo[2] = {ClampToTile(start0 - kb, kStream), ClampToTile(start1 - kb, kStream)};
      const int hi[2] = {ClampToTile(row0 - kb, kStream), ClampToTile(row1 - kb, kStream)};
#pragma unroll
      for (int j = 0; j < kStream / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = 8 * j + 2 * t + (e & 1), r = e / 2;
          const bool visible = !masked || (lo[r] <= c && c <= hi[r]);
          const float pr = visible ? exp2f(s[j][e] * p.scale_log2 - lse2[r]) : 0.0f;
          dp[j][e] = pr * (dp[j][e] - dsum[r]);
        }
      }
      // dQ += dS K: K [key][dqk] as the row-major B operand (ldmatrix.trans).
#pragma unroll
      for (int kk = 0; kk < kStream / 16; ++kk) {
        uint32_t a[4];
        AccumulatorsAsA(a, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
        for (int nn = 0; nn < kDqk / 16; ++nn) {
          uint32_t b[4];
          LoadFragB2(b, k_row, kDqk, kk * 16, nn * 16);
          MmaPair(acc[2 * nn], acc[2 * nn + 1], a, b);
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = r == 0 ? row0 : row1;
    if (row > q_last) continue;
    bf16* dqrow = p.dq + row * qk_stride + static_cast<int64_t>(h) * kDqk + 2 * t;
#pragma unroll
    for (int j = 0; j < kDqk / 8; ++j) {
      *reinterpret_cast<uint32_t*>(dqrow + 8 * j) =
          PackBf16(acc[j][2 * r] * p.scale, acc[j][2 * r + 1] * p.scale);
    }
  }
}

template <int kDqk, int kDv>
Status Backward(const BackwardArgs& args, cudaStream_t stream) {
  constexpr size_t kSmem = BackwardSharedBytes<kDqk, kDv>();
  const dim3 grid(static_cast<unsigned>((args.n + kBlockRows - 1) / kBlockRows),
                  static_cast<unsigned>(args.heads));
  auto* dkdv = AttentionDkDvTcKernel<kDqk, kDv>;
  ORRERY_RETURN_IF_ERROR(
      CudaStatus(cudaFuncSetAttribute(dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                 "AttentionDkDvTcKernel shared memory"));
  dkdv<<<grid, kThreads, kSmem, stream>>>(args);
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("AttentionDkDvTcKernel"));
  auto* dq = AttentionDqTcKernel<kDqk, kDv>;
  ORRERY_RETURN_IF_ERROR(
      CudaStatus(cudaFuncSetAttribute(dq, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                 "AttentionDqTcKernel shared memory"));
  dq<<<grid, kThreads, kSmem, stream>>>(args);
  return LastLaunchStatus("AttentionDqTcKernel");
}

}  // namespace
}  // namespace attention_tc

Status AttentionBackwardTc(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                           const Tensor& dsum, const Tensor& d_o, const Tensor& cu_seqlens,
                           double scale, Tensor* dq, Tensor* dk, Tensor* dv, cudaStream_t stream) {
  using attention_tc::bf16;
  attention_tc::BackwardArgs args;
  args.q = static_cast<const bf16*>(q.raw_data());
  args.k = static_cast<const bf16*>(k.raw_data());
  args.v = static_cast<const bf16*>(v.raw_data());
  args.d_o = static_cast<const bf16*>(d_o.raw_data());
  args.lse = lse.data<float>();
  args.dsum = dsum.data<float>();
  args.cu = cu_seqlens.data<int64_t>();
  args.entries = cu_seqlens.numel();
  args.n = q.dim(0);
  args.heads = static_cast<int>(q.dim(1));
  args.scale = static_cast<float>(scale);
  args.scale_log2 = static_cast<float>(scale) * attention_tc::kLog2e;
  args.dq = static_cast<bf16*>(dq->raw_data());
  args.dk = static_cast<bf16*>(dk->raw_data());
  args.dv = static_cast<bf16*>(dv->raw_data());
  if (q.dim(2) == 192) return attention_tc::Backward<192, 128>(args, stream);
  return attention_tc::Backward<128, 128>(args, stream);
}

}  // namespace orrery::kernels::cuda
