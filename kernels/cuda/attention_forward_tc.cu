// Causal attention forward per document (kernels/attention.h) on tensor cores, FlashAttention-2
// structure on bf16 `mma.sync.m16n8k16` with f32 accumulation (sm_80+ instructions, run on
// sm_90a; the wgmma/TMA form of FlashAttention-3 is the follow-up).
//
// Tiles: one block of 4 warps per (64-query tile, head); warp w owns query rows 16 w .. 16 w + 15.
// The block streams 64-key tiles of K [64][dqk] and V [64][dv] (bf16, swizzled rows, no padding)
// from the document start of its first query to its last query, two stages: the copy of tile
// t + 1 (cp.async) is in flight while tile t is multiplied. Per tile each warp forms
// S = Q K^T (16 x 64, f32 accumulators; Q fragments by ldmatrix from the block's Q tile, K by
// ldmatrix as the "col" B operand), updates its rows' running max and sum in the log2 domain
// (online softmax in registers: a row lives in the 4 lanes of a quad, reduced by two shuffles),
// rounds P to bf16 straight from the S accumulators into A fragments and adds P V (V by
// ldmatrix.trans) into the 16 x dv output accumulators. Only a tile that crosses the causal
// diagonal or a document start is masked per element; a warp skips a tile none of its rows sees.
// Blocks run from the last query tile to the first, so that the longest ones start first.
// Shared memory: (64 dqk + 2 * 64 (dqk + dv)) bf16 = 104 KB at 192/128, two blocks per SM.
//
// Head dims are template arguments: (192, 128) and (128, 128) (AttentionTcSupported). So is the
// row map (attention_tc_layout.h): CausalRows for CausalAttention, PrefixRows for
// PrefixCausalAttention (queries the last n_d of a context of L_d keys, packed with their own
// offsets; the same loop over the keys First(q0) .. Last(q_last) of a block).
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

constexpr int kKeyTile = 64;

template <int kDqk, int kDv>
constexpr size_t ForwardSharedBytes() {
  return sizeof(bf16) * (kBlockRows * kDqk + 2 * kKeyTile * (kDqk + kDv));
}

// Rows: which keys each query row sees (attention_tc_layout.h: CausalRows, PrefixRows); n query
// rows, nk key rows.
template <int kDqk, int kDv, class Rows>
__global__ void __launch_bounds__(kThreads, 2)
    AttentionForwardTcKernel(const bf16* __restrict__ q, const bf16* __restrict__ k,
                             const bf16* __restrict__ v, const Rows rows, int64_t n, int64_t nk,
                             int heads, float scale_log2, bf16* __restrict__ o,
                             float* __restrict__ lse) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);  // [64][dqk]
  bf16* ks = qs + kBlockRows * kDqk;         // [2][64][dqk]
  bf16* vs = ks + 2 * kKeyTile * kDqk;       // [2][64][dv]
  const int h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kBlockRows;
  const int64_t q_last = (q0 + kBlockRows < n ? q0 + kBlockRows : n) - 1;
  const int64_t qk_stride = static_cast<int64_t>(heads) * kDqk;
  const int64_t v_stride = static_cast<int64_t>(heads) * kDv;

  // Keys from the first query's document start on; every key of [kv_begin, rows.Last(q_last)] is
  // seen by some query of the block (by itself, if not by q0), so no tile in range is wholly
  // masked (causal; PrefixRows may stream a masked one, attention_tc_layout.h).
  const int64_t kv_begin = rows.First(q0);
  const int64_t last_start = rows.First(q_last);  // the largest row start
  const int64_t first_end = rows.Last(q0);        // the smallest row end (causal: q0)
  // This lane's two rows (accumulator rows g and g + 8 of the warp's 16) and their key ranges.
  const int64_t row0 = q0 + warp * kRowsPerWarp + g, row1 = row0 + 8;
  const int64_t start0 = rows.First(row0), start1 = rows.First(row1);
  const int64_t end0 = rows.Last(row0), end1 = rows.Last(row1);
  // The warp's rows: the smallest start is its first row's, the last row caps at q_last.
  const int64_t warp_first = q0 + warp * kRowsPerWarp;
  const int64_t warp_last =
      warp_first + kRowsPerWarp - 1 < q_last ? warp_first + kRowsPerWarp - 1 : q_last;
  const int64_t warp_start = rows.First(warp_first), warp_end = rows.Last(warp_last);
  const int tiles = KeyTiles(kv_begin, rows.Last(q_last), kKeyTile);

  LoadTileAsync<kBlockRows, kDqk>(qs, q, q0, n, qk_stride, h);
  LoadTileAsync<kKeyTile, kDqk>(ks, k, kv_begin, nk, qk_stride, h);
  LoadTileAsync<kKeyTile, kDv>(vs, v, kv_begin, nk, v_stride, h);
  CpAsyncCommit();

  float acc[kDv / 8][4];  // O rows (g, g + 8) x columns 8 j + 2t, + 1 (m16n8 accumulators)
#pragma unroll
  for (int j = 0; j < kDv / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  const uint32_t q_lane = LaneBase(qs, kDqk, true);    // Q: A operand, row order
  const uint32_t k_lane0 = LaneBase(ks, kDqk, false);  // K: "col" B operand, column order
  const uint32_t v_lane0 = LaneBase(vs, kDv, true);    // V: B operand by .trans, row order
  float m[2] = {-INFINITY, -INFINITY};  // running max of the rows' log2-scaled scores
  float l[2] = {0.0f, 0.0f};            // this lane's part of the running sums (its 2 columns)

  for (int it = 0; it < tiles; ++it) {
    const int64_t kb = kv_begin + static_cast<int64_t>(it) * kKeyTile;
    const int buf = it & 1;
    if (it + 1 < tiles) {  // the next stage; its buffer was released by the last barrier
      LoadTileAsync<kKeyTile, kDqk>(ks + (buf ^ 1) * kKeyTile * kDqk, k, kb + kKeyTile, nk,
                                    qk_stride, h);
      LoadTileAsync<kKeyTile, kDv>(vs + (buf ^ 1) * kKeyTile * kDv, v, kb + kKeyTile, nk, v_stride,
                                   h);
    }
    CpAsyncCommit();          // (empty on the last tile: keeps the wait below uniform)
    CpAsyncWaitPending<1>();  // tile it (and the Q tile) landed for this thread's copies
    __syncthreads();          // ... and for everyone's
    // ldmatrix lane bases of this stage's tiles (attention_tc_tiles.cuh, FragmentAddress).
    const uint32_t k_lane = k_lane0 + buf * kKeyTile * kDqk * 2;
    const uint32_t v_lane = v_lane0 + buf * kKeyTile * kDv * 2;

    // Warp-uniform: keys all after the warp's last row, or all before its first row's document.
    if (WarpSeesKeyTile(kb, kKeyTile, warp_start, warp_end)) {
      // S = Q K^T: s[j] holds keys kb + 8 j .. + 7 (columns 2t, 2t + 1 of rows g, g + 8).
      float s[kKeyTile / 8][4];
#pragma unroll
      for (int j = 0; j < kKeyTile / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kDqk / 16; ++kk) {
        uint32_t a[4];
        LoadFragA(a, q_lane, kDqk, warp * kRowsPerWarp, kk * 16);
#pragma unroll
        for (int nn = 0; nn < kKeyTile / 16; ++nn) {
          uint32_t b[4];
          LoadFragBT2(b, k_lane, kDqk, nn * 16, kk * 16);
          MmaPair(s[2 * nn], s[2 * nn + 1], a, b);
        }
      }
      // Scaled to log2 units, then masked where the tile crosses the diagonal or a document
      // start (wholly visible: every key at or after the latest row start and at or before the
      // earliest row end). Per element in tile-relative 32-bit offsets: key kb + c is visible to
      // row r when lo[r] <= c <= hi[r] (row start - kb and row end - kb, clamped to the tile).
#pragma unroll
      for (int j = 0; j < kKeyTile / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] *= scale_log2;
      }
      if (!KeyTileWhollyVisible(kb, kKeyTile, first_end, last_start)) {
        const int lo[2] = {ClampToTile(start0 - kb, kKeyTile), ClampToTile(start1 - kb, kKeyTile)};
        const int hi[2] = {ClampToTile(end0 - kb, kKeyTile), ClampToTile(end1 - kb, kKeyTile)};
#pragma unroll
        for (int j = 0; j < kKeyTile / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int c = 8 * j + 2 * t + (e & 1);
            if (c < lo[e / 2] || c > hi[e / 2]) s[j][e] = -INFINITY;
          }
        }
      }
      // Online softmax per row r (accumulator elements 2r, 2r + 1): the quad's max by two
      // shuffles; a row with no visible key yet keeps m = -inf and uses 0 as its reference
      // (p = 0, alpha = 0 instead of NaN).
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = m[r];
#pragma unroll
        for (int j = 0; j < kKeyTile / 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float ref = mx == -INFINITY ? 0.0f : mx;
        const float alpha = exp2f(m[r] - ref);
        m[r] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < kKeyTile / 8; ++j) {
          s[j][2 * r] = exp2f(s[j][2 * r] - ref);
          s[j][2 * r + 1] = exp2f(s[j][2 * r + 1] - ref);
          sum += s[j][2 * r] + s[j][2 * r + 1];
        }
        l[r] = l[r] * alpha + sum;
#pragma unroll
        for (int j = 0; j < kDv / 8; ++j) {
          acc[j][2 * r] *= alpha;
          acc[j][2 * r + 1] *= alpha;
        }
      }
      // O += P V: P (16 x 64, bf16) from the S accumulators (AccumulatorsAsA), V [key][dv] as the
      // row-major B operand (LoadFragB2, ldmatrix.trans).
#pragma unroll
      for (int kk = 0; kk < kKeyTile / 16; ++kk) {
        uint32_t a[4];
        AccumulatorsAsA(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
        for (int nn = 0; nn < kDv / 16; ++nn) {
          uint32_t b[4];
          LoadFragB2(b, v_lane, kDv, kk * 16, nn * 16);
          MmaPair(acc[2 * nn], acc[2 * nn + 1], a, b);
        }
      }
    }
    __syncthreads();  // every warp is done with buffer `buf` before the next stage refills it
  }

  // o = acc / l, lse = (m + log2 l) ln 2 for the rows below n (the quad's sum by two shuffles).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = l[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int64_t row = r == 0 ? row0 : row1;
    if (row > q_last) continue;
    // sum > 0: every row sees a key (its own; PrefixRows: when n_d <= L_d, else o = 0, lse = -inf)
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    bf16* orow = o + row * v_stride + static_cast<int64_t>(h) * kDv + 2 * t;
#pragma unroll
    for (int j = 0; j < kDv / 8; ++j) {
      *reinterpret_cast<uint32_t*>(orow + 8 * j) =
          PackBf16(acc[j][2 * r] * inv, acc[j][2 * r + 1] * inv);
    }
    if (t == 0) lse[row * heads + h] = sum > 0.0f ? (m[r] + log2f(sum)) * kLn2 : -INFINITY;
  }
}

template <int kDqk, int kDv, class Rows>
Status Forward(const Tensor& q, const Tensor& k, const Tensor& v, const Rows& rows, double scale,
               Tensor* o, Tensor* lse, cudaStream_t stream) {
  const int64_t n = q.dim(0);
  const int heads = static_cast<int>(q.dim(1));
  constexpr size_t kSmem = ForwardSharedBytes<kDqk, kDv>();
  auto* kernel = AttentionForwardTcKernel<kDqk, kDv, Rows>;
  ORRERY_RETURN_IF_ERROR(
      CudaStatus(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                 "AttentionForwardTcKernel shared memory"));
  const dim3 grid(static_cast<unsigned>((n + kBlockRows - 1) / kBlockRows),
                  static_cast<unsigned>(heads));
  kernel<<<grid, kThreads, kSmem, stream>>>(
      static_cast<const bf16*>(q.raw_data()), static_cast<const bf16*>(k.raw_data()),
      static_cast<const bf16*>(v.raw_data()), rows, n, k.dim(0), heads,
      static_cast<float>(scale) * kLog2e, static_cast<bf16*>(o->raw_data()), lse->data<float>());
  return LastLaunchStatus("AttentionForwardTcKernel");
}

template <class Rows>
Status ForwardDims(const Tensor& q, const Tensor& k, const Tensor& v, const Rows& rows,
                   double scale, Tensor* o, Tensor* lse, cudaStream_t stream) {
  if (q.dim(2) == 192) return Forward<192, 128>(q, k, v, rows, scale, o, lse, stream);
  return Forward<128, 128>(q, k, v, rows, scale, o, lse, stream);
}

}  // namespace
}  // namespace attention_tc

bool AttentionTcSupported(const Tensor& q, const Tensor& v) {
  const int64_t dqk = q.dim(2), dv = v.dim(2);
  return q.dtype() == DType::kBF16 && dv == 128 && (dqk == 192 || dqk == 128);
}

Status AttentionForwardTc(const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& cu_seqlens, double scale, Tensor* o, Tensor* lse,
                          cudaStream_t stream) {
  const attention_tc::CausalRows rows{cu_seqlens.data<int64_t>(), cu_seqlens.numel(), q.dim(0)};
  return attention_tc::ForwardDims(q, k, v, rows, scale, o, lse, stream);
}

Status PrefixAttentionForwardTc(const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& cu_q, const Tensor& cu_k, double scale, Tensor* o,
                                Tensor* lse, cudaStream_t stream) {
  const attention_tc::PrefixRows rows{cu_q.data<int64_t>(), cu_k.data<int64_t>(), cu_q.numel(),
                                      q.dim(0)};
  return attention_tc::ForwardDims(q, k, v, rows, scale, o, lse, stream);
}

}  // namespace orrery::kernels::cuda
