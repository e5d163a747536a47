// KDA chunked backward on tensor cores (spec §2.4, §2.8): bf16 operands, fp32 accumulation, fp32
// state gradient, 64-token chunks in 16x16 tiles (the forward's tiling, kda_forward_tc.cu).
//
// Three stages; only the second is sequential over chunks:
// 1. Recompute: the tensor-core forward keeps W, s Q e^G, Kbar^T, A_qk, gamma = e^{G_C}, T and,
//    from its state pass, the state h at every chunk start and Vnew (all bf16, as the forward
//    rounded them).
// 2. KdaReverseStatePassKernel, one block per (segment, head, 64-wide V slice), chunks in
//    reverse, the K x 64 slice of dS (gradient of the chunk-end state) in fp32 registers as MMA
//    accumulators; per chunk: dh = dS (kept), dVnew = A_qk^T dO + Kbar dS (kept),
//    dS <- Diag(gamma) dS + (s Q e^G)^T dO - W^T dVnew, finally dh0. For long sequences the
//    chunks are split into the forward's segments: every segment but the first runs from a zero
//    dS, and KdaSegmentCombine chains dS_end(j - 1) = P_j dS_end(j) + dS_ext,j from dht with
//    the segment's transition P_j = prod (Diag(gamma) - W^T Kbar), chunks in reverse, which is
//    the transpose of the forward's M_j = prod (Diag(gamma) - Kbar^T W): the forward kept it.
// 3. KdaBackwardChunkKernel, one block of 16 warps per (chunk, head), every chunk at once (its
//    shared memory allows one block per SM; 16 warps at 128 registers each rather than 8 at 168
//    hide the latency of the MMA chains and shared-memory loads: 3.3 -> 2.9 ms at 8x8192x16).
//    First the products over V: dQ = dO h^T, dW = -dVnew h^T, dKbar = Vnew dh^T, dA_qk = dO Vnew^T,
//    dT_v = dVnew (beta V)^T, dv = beta T^T dVnew, the V part of dbeta, and
//    dG_C = gamma sum_v h dh; they stay on chip for the rest (as two kernels, ~88 KB per block
//    went out to global memory and back): dT = dT_v + dW (beta K e^G)^T,
//    dBk = T^T dW, dA_kk = -T^T dT T^T (strictly lower), then the pairwise terms of A_qk and A_kk
//    as MMAs per 16-row tile: the row side (dq, dk of row r, against the reference row n = the
//    tile's first row) aq Y and dA_kk Y with Y = K e^{G_n - G}, scaled by e^{G_r - G_n}; the column
//    side (dk of column j, reference m = the tile's last row) aq^T (Q e^{G - G_m}) +
//    dA_kk^T (beta K e^{G - G_m}), scaled by e^{G_m - G_j}. Off the diagonal every exponent is
//    <= 0; on the diagonal tile the factors reach 2^span as in the forward, and a diagonal tile
//    whose span exceeds kMaxTileSpan (the original gate with strong decays) is summed pairwise
//    in fp32 with exponents <= 0 instead. Every pair (r, j) adds a term to dG_r and takes the
//    same term from dG_j, and the reverse cumsum of dG cancels every pair with both ends past
//    the row it sums from; the two sides are formed from different operands (Y here, X there),
//    so these operands are split into bf16 hi + lo (two MMAs, ~16 bits) and the r = j terms
//    (whose dG parts cancel exactly) are added in fp32 outside the MMAs: with plain bf16 the
//    leftovers of the cancelled pairs swamp dg under strong decays (measured: 0.49 relative
//    RMS error at g near -5). The element-wise terms of Q e^G, K e^G and K e^{G_C - G} follow,
//    then dg = the reverse cumsum of dG plus the chunk-end term. With the op's input transforms
//    (a second instantiation) the kernel takes the raw q, k, g, beta, applies the transforms as
//    they load and their chain rule before it writes the raw inputs' gradients.
// No float atomics: the sums that several warps of a block share (dbeta's K part, dG_C's Kbar
// part, the L2 norms' row dots) go to a shared slot per warp, added in a fixed order where they
// are read, and the gate parameters' gradients go per (chunk, head) to a scratch that
// LaunchColumnSums (column_sums.h) sums over the chunks: the same inputs give the same bits on
// every run. The slots cost ~5 KB of shared memory and a few shared loads per row.
#include <cuda_bf16.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "kernels/cuda/column_sums.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/kda_cuda.h"
#include "kernels/cuda/kda_cuda_util.cuh"
#include "kernels/cuda/kda_mma.cuh"
#include "kernels/cuda/kda_tc_chunk_load.cuh"
#include "kernels/cuda/kda_tc_layout.cuh"
#include "kernels/cuda/kda_tc_segments.h"
#include "kernels/cuda/kda_tc_state_slice.cuh"

namespace orrery::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kChunk = kTcChunk;
constexpr int kSliceV = kTcSliceV;
constexpr int kST = kTileStrideA;
constexpr int kPassThreads = 128;   // reverse pass: 4 warps
constexpr int kChunkThreads = 512;  // chunk kernel: 16 warps (the register file at 128 each)
// Column parts per 16-row tile in the chunk kernel: warp w takes row tile w % 4, part w / 4.
constexpr int kChunkParts = kChunkThreads / 128;

// ---------------------------------------------------------------------------------------------
// Stage 2: the reverse state pass.

struct RevParams {
  const bf16 *w, *qg, *kbar_t, *aqk;  // the forward's prep outputs
  const float* gamma;
  const bf16* d_o;  // [rows, H, V]
  const ChunkDesc* chunks;
  const SegmentDesc* segments;
  bf16* ndvnew;   // [chunks, H, V, 64] or null: -dVnew^T
  bf16* dh;       // [chunks, H, V, K] or null: dS^T at each chunk end
  int heads, vd;  // state_in and state_out rows: V floats
};

template <int KD>
__global__ void __launch_bounds__(kPassThreads) KdaReverseStatePassKernel(RevParams p) {
  using L = StatePassSmem<KD, 1>;
  constexpr int SK = L::kSK, SU = L::kSU, ST = kST;
  constexpr int kMT = StateSlice<KD>::kMT, kNT = StateSlice<KD>::kNT;
  static_assert(SU == ST, "dO's second buffer is the forward's output tile region");
  // The operands copied in (W, s Q e^G, Kbar^T, A_qk, dO) lie in swizzled rows without padding
  // (SwizzledOffset, kda_mma.cuh) inside the layout's padded regions: their 16-byte copies then
  // fill whole 128-byte shared lines (measured: the pass 0.73 -> 0.67 ms at 8x8192x16).
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ws = reinterpret_cast<bf16*>(smem + L::kW);   // W          [64][K] swizzled
  bf16* qs = reinterpret_cast<bf16*>(smem + L::kQ);   // s Q e^G    [64][K] swizzled
  bf16* kb = reinterpret_cast<bf16*>(smem + L::kKb);  // Kbar^T     [K][64] swizzled
  bf16* as = reinterpret_cast<bf16*>(smem + L::kA);   // A_qk       [64][64] swizzled
  float* gam = reinterpret_cast<float*>(smem + L::kGam);
  // dO slice [64][64] swizzled, two buffers (the second over the forward's output tile, unused
  // here): chunk ch's in dos_buf[ch & 1], copied while chunk ch + 1 finishes.
  bf16* const dos_buf[2] = {reinterpret_cast<bf16*>(smem + L::kGroup + L::kSlice),
                            reinterpret_cast<bf16*>(smem + L::kGroup + L::kO)};
  bf16* ss = reinterpret_cast<bf16*>(smem + L::kGroup + L::kS);   // dS^T bf16  [64][SK]
  bf16* vt = reinterpret_cast<bf16*>(smem + L::kGroup + L::kVt);  // -dVnew^T   [64][ST]

  const int tid = threadIdx.x, warp = tid >> 5;
  const int h = blockIdx.y, heads = p.heads, vd = p.vd;
  const int v0 = blockIdx.z * kSliceV;
  const SegmentDesc seg = p.segments[blockIdx.x];

  // dS: the slice this block carries (kda_tc_state_slice.cuh).
  StateSlice<KD> dS;
  dS.Init(false, 0,
          seg.state_in != nullptr ? seg.state_in + static_cast<int64_t>(h) * KD * vd + v0 : nullptr,
          vd);
  dS.StoreTransposedBf16(ss, SK);
  // Stage one of a chunk's copies, issued a chunk ahead: A_qk, Kbar^T and dO (what dVnew reads;
  // rows of dO past the chunk's end: zeros).
  auto load_akb_do = [&](int64_t ch, const ChunkDesc& cd) {
    const int64_t tile = ch * heads + h;
    for (int i = tid; i < KD * kChunk / 8; i += kPassThreads) {
      const int d = i / (kChunk / 8), c = (i % (kChunk / 8)) * 8;
      CpAsync16(kb + SwizzledOffset(d, c, kChunk), p.kbar_t + (tile * KD + d) * kChunk + c);
    }
    for (int i = tid; i < kChunk * kSliceV / 8; i += kPassThreads) {
      const int r = i / (kSliceV / 8), c = (i % (kSliceV / 8)) * 8;
      CpAsync16(as + SwizzledOffset(r, c, kChunk), p.aqk + (tile * kChunk + r) * kChunk + c);
    }
    bf16* dos = dos_buf[ch & 1];
    for (int i = tid; i < kChunk * kSliceV / 8; i += kPassThreads) {
      const int r = i / (kSliceV / 8), c = (i % (kSliceV / 8)) * 8;
      if (r < cd.len) {
        CpAsync16(dos + SwizzledOffset(r, c, kSliceV),
                  p.d_o + ((cd.row_start + r) * heads + h) * vd + v0 + c);
      } else {
        *reinterpret_cast<uint4*>(dos + r * kSliceV + c) = make_uint4(0, 0, 0, 0);
      }
    }
    CpAsyncCommit();
  };
  if (seg.chunk_end > seg.chunk_begin) load_akb_do(seg.chunk_end - 1, p.chunks[seg.chunk_end - 1]);

  for (int64_t ch = seg.chunk_end - 1; ch >= seg.chunk_begin; --ch) {
    const int64_t tile = ch * heads + h;
    const bf16* dos = dos_buf[ch & 1];
    // The previous chunk's descriptor, read now: its copies go out mid-chunk, and a load there
    // left the whole global latency exposed (Nsight Compute: 84% of the pass's long-scoreboard
    // stalls).
    const ChunkDesc prev_cd = ch - 1 >= seg.chunk_begin ? p.chunks[ch - 1] : ChunkDesc{0, 0};
    // The chunk's other operands, W, s Q e^G and gamma (read by the dS update); A_qk, Kbar and dO
    // are already on their way. The previous iteration ended with a barrier.
    for (int i = tid; i < kChunk * KD / 8; i += kPassThreads) {
      const int r = i / (KD / 8), c = (i % (KD / 8)) * 8;
      CpAsync16(ws + SwizzledOffset(r, c, KD), p.w + (tile * kChunk + r) * KD + c);
      CpAsync16(qs + SwizzledOffset(r, c, KD), p.qg + (tile * kChunk + r) * KD + c);
    }
    for (int i = tid; i < KD / 4; i += kPassThreads)
      CpAsync16(gam + 4 * i, p.gamma + tile * KD + 4 * i);
    CpAsyncCommit();
    CpAsyncWaitPending<1>();
    __syncthreads();

    // dVnew = A_qk^T dO + Kbar dS for rows 16 warp .. 16 warp + 15; -dVnew^T to shared memory.
    {
      float acc[kNT][4] = {};
      for (int kt = warp; kt < kChunk / 16; ++kt) {  // A_qk[m][r] = 0 for m < r
        uint32_t fa[4];
        LoadFragATSwizzled(fa, as, kChunk, 16 * warp, 16 * kt);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          uint32_t fb[2];
          LoadFragBSwizzled(fb, dos, kSliceV, 16 * kt, 8 * nt);
          MmaBf16(acc[nt], fa, fb);
        }
      }
#pragma unroll
      for (int k0 = 0; k0 < KD; k0 += 16) {
        uint32_t fa[4];
        LoadFragATSwizzled(fa, kb, kChunk, 16 * warp, k0);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          uint32_t fb[2];
          LoadFragBT(fb, ss + 8 * nt * SK, SK, k0);
          MmaBf16(acc[nt], fa, fb);
        }
      }
#pragma unroll
      for (int nt = 0; nt < kNT; nt += 2) {
        const float n0[4] = {-acc[nt][0], -acc[nt][1], -acc[nt][2], -acc[nt][3]};
        const float n1[4] = {-acc[nt + 1][0], -acc[nt + 1][1], -acc[nt + 1][2], -acc[nt + 1][3]};
        StoreTileTransposedBf16(n0, n1, vt + 8 * nt * ST + 16 * warp, ST);
      }
    }
    // dS at the chunk's end as rounded in shared memory (unchanged until the chunk's last
    // barrier), out transposed in whole rows behind the dVnew product.
    if (p.dh != nullptr)
      CopyRowsToGlobal<kSliceV, KD, kPassThreads>(ss, SK, p.dh + (tile * vd + v0) * KD, KD, tid);
    CpAsyncWaitPending<0>();
    __syncthreads();
    if (p.ndvnew != nullptr) {
      CopyRowsToGlobal<kSliceV, kChunk, kPassThreads>(vt, ST, p.ndvnew + (tile * vd + v0) * kChunk,
                                                      kChunk, tid);
    }
    // A_qk and Kbar are read: the previous chunk's arriving while this one finishes (its dO into
    // the other buffer: this chunk's is read once more, by the dS update).
    if (ch - 1 >= seg.chunk_begin) load_akb_do(ch - 1, prev_cd);

    // dS <- Diag(gamma) dS + (s Q e^G)^T dO - W^T dVnew.
    dS.ScaleRows(gam);
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) {
      const int d0 = warp * (KD / 4) + 16 * mi;
#pragma unroll
      for (int kt = 0; kt < kChunk / 16; ++kt) {
        uint32_t fw[4];
        LoadFragATSwizzled(fw, ws, KD, d0, 16 * kt);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          uint32_t fb[2];
          LoadFragBT(fb, vt + 8 * nt * ST, ST, 16 * kt);
          MmaBf16(dS.x[mi][nt], fw, fb);
        }
        uint32_t fq[4];
        LoadFragATSwizzled(fq, qs, KD, d0, 16 * kt);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          uint32_t fb[2];
          LoadFragBSwizzled(fb, dos, kSliceV, 16 * kt, 8 * nt);
          MmaBf16(dS.x[mi][nt], fq, fb);
        }
      }
    }
    __syncthreads();
    dS.StoreTransposedBf16(ss, SK);
  }

  if (seg.state_out != nullptr) {
    dS.StoreF32(seg.state_out + static_cast<int64_t>(h) * KD * vd + v0, vd);
  }
}

// ---------------------------------------------------------------------------------------------
// Stage 3: the chunk kernel, per (chunk, head), every chunk at once. The products over V come
// first; what they hand to the rest (dW, s dA_qk, dT_v, dQ, dKbar, the V parts of dbeta and
// dG_C) stays on chip, in shared memory or in the registers of the thread that reads it next;
// then T, A_kk, the pairwise and element-wise terms.

template <typename GIn>
struct ChunkParams {
  const bf16 *q, *k, *v, *beta, *d_o;  // inputs [rows, H, K | V], beta [rows, H]
  const GIn* g;                        // [rows, H, K]
  // Transposed, as the state passes copy them out: h, dh [chunks, H, V, K], Vnew and -dVnew
  // [chunks, H, V, 64].
  const bf16 *h, *dh, *vnew, *ndvnew;
  const bf16* tinv;    // [chunks, H, 64, 64]
  const float* gamma;  // [chunks, H, K]
  const ChunkDesc* chunks;
  bf16 *dq, *dk, *dv, *dbeta;
  GIn* dg;
  int heads;
  float scale;
  // kTransforms: q, k, g and beta are the raw inputs of these transforms, applied as they load;
  // dq, dk, dg (then dz), dbeta are the raw inputs' gradients, and with the gate each block
  // writes its (chunk, head) share of dA_log and ddt_bias to da_log_parts [chunks, H] and
  // ddt_bias_parts [chunks, H, K] (or null), which LaunchColumnSums adds up in a fixed order.
  ChunkInputTransforms tr;
  float *da_log_parts, *ddt_bias_parts;
};

// Shared memory of the chunk kernel. Three parts:
// - kept throughout: T, dW, s dA_qk (strictly lower, bf16) and the per-row and per-column vectors;
// - the V phase: dO, -dVnew^T, Vnew^T, V, h^T, dh^T (bf16). dQ = dO h^T and dKbar = Vnew dh^T
//   (fp32, in accumulator order: each thread's values contiguous across the block, read back by
//   the same thread) go over dO + dVnew and Vnew + V once those are dead when they fit there,
//   else into a region of their own before the V phase's;
// - the K phase, over h and dh (or over the whole V phase): G (dG at the end over it), beta K e^G,
//   dT, dA_kk; then q and k, past everything of the V phase.
template <int KD, int VD>
struct ChunkSmem {
  static constexpr int kSK = KD + 8;                             // bf16 per q/k/dW row
  static constexpr int kSG = KD + 4;                             // floats per G row
  static constexpr int kSV = VD + 8;                             // bf16 per V-wide row
  static constexpr size_t kTile = sizeof(bf16) * kChunk * kST;   // a 64x64 bf16 tile
  static constexpr size_t kRowsK = sizeof(bf16) * kChunk * kSK;  // [64][K] bf16
  static constexpr size_t kRowsV = sizeof(bf16) * kChunk * kSV;  // [64][V] bf16
  static constexpr size_t kRowsVT = sizeof(bf16) * VD * kST;     // [V][64] bf16
  static constexpr size_t kStateT = sizeof(bf16) * VD * kSK;     // [V][K] bf16
  static constexpr size_t kFragK = sizeof(float) * kChunk * KD;  // [64][K] fp32
  static constexpr size_t kT = 0;
  static constexpr size_t kDw = kT + kTile;
  static constexpr size_t kAq = kDw + kRowsK;
  static constexpr size_t kBeta = kAq + kTile;
  static constexpr size_t kDbv = kBeta + sizeof(float) * kChunk;  // dbeta's V part, per column part
  static constexpr size_t kDbk = kDbv + sizeof(float) * kChunkParts * kChunk;  // its other parts
  static constexpr size_t kAqd = kDbk + sizeof(float) * kChunkParts * kChunk;  // s dA_qk[r][r]
  static constexpr size_t kGam = kAqd + sizeof(float) * kChunk;                // gamma [K]
  static constexpr size_t kDgcV = kGam + sizeof(float) * KD;       // gamma sum_v h dh [K]
  static constexpr size_t kDgcK = kDgcV + sizeof(float) * KD;      // dG_C's Kbar part [4 tiles][K]
  static constexpr size_t kRstd = kDgcK + sizeof(float) * 4 * KD;  // q, k rows' L2 factors [2][64]
  static constexpr size_t kRowDot = kRstd + sizeof(float) * 2 * kChunk;  // [parts][2][64]
  static constexpr size_t kMma = kRowDot + sizeof(float) * kChunkParts * 2 * kChunk;  // int [4]
  // The gate parameters' sums of the block: ddt_bias per (row half, column), dA_log per warp of
  // the cumsum's 2 K threads.
  static constexpr size_t kGateSums = kMma + 16;
  static constexpr size_t kKeptEnd = kGateSums + sizeof(float) * (2 * KD + 2 * KD / 32);
  static constexpr bool kOverlay = kFragK <= kRowsV + kRowsVT;
  static constexpr size_t kDq = kKeptEnd;
  static constexpr size_t kDk = kOverlay ? kDq + kRowsV + kRowsVT : kDq + kFragK;
  static constexpr size_t kDo = kOverlay ? kKeptEnd : kDk + kFragK;
  static constexpr size_t kDvn = kDo + kRowsV;
  static constexpr size_t kVn = kDvn + kRowsVT;
  static constexpr size_t kV = kVn + kRowsVT;
  static constexpr size_t kH = kV + kRowsV;
  static constexpr size_t kDh = kH + kStateT;
  static constexpr size_t kVEnd = kDh + kStateT;
  static constexpr size_t kG = kOverlay ? kH : kDo;
  static constexpr size_t kDG = kG;
  static constexpr size_t kBk = kG + sizeof(float) * kChunk * kSG;
  static constexpr size_t kDt = kBk + kRowsK;
  static constexpr size_t kAk = kDt + kTile;
  // q and k lie past the V phase's regions: their copies are issued with the V phase's.
  static constexpr size_t kQ = kAk + kTile > kVEnd ? kAk + kTile : kVEnd;
  static constexpr size_t kK = kQ + kRowsK;
  static constexpr size_t kKEnd = kK + kRowsK;
  static constexpr size_t kBytes = kKEnd;
  static_assert(kDw % 16 == 0 && kAq % 16 == 0 && kBeta % 16 == 0 && kGam % 16 == 0 &&
                    kGateSums % 16 == 0 && kKeptEnd % 16 == 0 && kDk % 16 == 0 && kDo % 16 == 0 &&
                    kDvn % 16 == 0 && kVn % 16 == 0 && kV % 16 == 0 && kH % 16 == 0 &&
                    kDh % 16 == 0 && kBk % 16 == 0 && kDt % 16 == 0 && kAk % 16 == 0 &&
                    kQ % 16 == 0 && kK % 16 == 0,
                "16-byte aligned regions");
  static_assert(kBytes <= 227 * 1024, "one block per multiprocessor");
};

// kTransforms: p.tr applies (raw inputs); compiled apart so that the plain path carries none of it.
template <int KD, int VD, typename GIn, bool kTransforms>
__global__ void __launch_bounds__(kChunkThreads) KdaBackwardChunkKernel(ChunkParams<GIn> p) {
  using L = ChunkSmem<KD, VD>;
  constexpr int SK = L::kSK, SG = L::kSG, SV = L::kSV, ST = kST;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ts = reinterpret_cast<bf16*>(smem + L::kT);    // T                    [64][ST]
  bf16* dws = reinterpret_cast<bf16*>(smem + L::kDw);  // dW = -dVnew h^T      [64][SK]
  bf16* aqs = reinterpret_cast<bf16*>(smem + L::kAq);  // s dA_qk (j < r)      [64][ST]
  float* bs = reinterpret_cast<float*>(smem + L::kBeta);
  float* dbv = reinterpret_cast<float*>(smem + L::kDbv);        // [parts][64] dbeta, V part
  float* dbk = reinterpret_cast<float*>(smem + L::kDbk);        // [parts][64] dbeta, K part
  float* aqd = reinterpret_cast<float*>(smem + L::kAqd);        // s dA_qk[r][r], fp32
  float* gam = reinterpret_cast<float*>(smem + L::kGam);        // gamma [K]
  float* dgcv = reinterpret_cast<float*>(smem + L::kDgcV);      // dG_C, state part
  float* dgck = reinterpret_cast<float*>(smem + L::kDgcK);      // [4][K] dG_C, Kbar part
  int* diag_mma = reinterpret_cast<int*>(smem + L::kMma);       // diagonal tile t on tensor cores
  float* rstd = reinterpret_cast<float*>(smem + L::kRstd);      // [2][64]: q, k rows' L2 factors
  float* rowdot = reinterpret_cast<float*>(smem + L::kRowDot);  // [parts][2][64]: q, k row dots
  float* gsum = reinterpret_cast<float*>(smem + L::kGateSums);  // the gate parameters' sums
  float2* dqf = reinterpret_cast<float2*>(smem + L::kDq);       // dQ, accumulator order
  float2* dkf = reinterpret_cast<float2*>(smem + L::kDk);       // dKbar, accumulator order
  bf16* dos = reinterpret_cast<bf16*>(smem + L::kDo);           // dO     [64][SV]
  bf16* dvs = reinterpret_cast<bf16*>(smem + L::kDvn);          // -dVnew^T [V][ST]
  bf16* vns = reinterpret_cast<bf16*>(smem + L::kVn);           // Vnew^T   [V][ST]
  bf16* vs = reinterpret_cast<bf16*>(smem + L::kV);             // V        [64][SV]
  bf16* hs = reinterpret_cast<bf16*>(smem + L::kH);             // h^T      [V][SK]
  bf16* dhs = reinterpret_cast<bf16*>(smem + L::kDh);           // dh^T     [V][SK]
  float* G = reinterpret_cast<float*>(smem + L::kG);            // cumsum of g, log2    [64][SG]
  float* dGs = reinterpret_cast<float*>(smem + L::kDG);         // dG (at the end)      [64][SG]
  bf16* bks = reinterpret_cast<bf16*>(smem + L::kBk);           // beta k e^G           [64][SK]
  bf16* dts = reinterpret_cast<bf16*>(smem + L::kDt);           // dT, then T^T dT      [64][ST]
  bf16* aks = reinterpret_cast<bf16*>(smem + L::kAk);           // dA_kk (j < r)        [64][ST]
  bf16* qs = reinterpret_cast<bf16*>(smem + L::kQ);             // q                    [64][SK]
  bf16* ks = reinterpret_cast<bf16*>(smem + L::kK);             // k                    [64][SK]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g8 = lane >> 2, t4 = lane & 3;
  const int h = blockIdx.y, heads = p.heads;
  const ChunkDesc cd = p.chunks[blockIdx.x];
  const int len = static_cast<int>(cd.len);
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * heads + h;
  const int64_t row_base = tile * kChunk;
  const float scale = p.scale;
  const ChunkInputTransforms* tr = kTransforms ? &p.tr : nullptr;
  const bool l2norm = kTransforms && p.tr.qk_l2norm;
  // Every product below: warp w takes row tile a = w % 4 (16 rows) and column part w / 4, a
  // kChunkParts-th of the columns; a thread's accumulators sit at rows 16 a + g8 (+ 8) and columns
  // 2 t4 (+ 1) of each 8-wide column tile, in the V phase and the K phase alike, so what one hands
  // to the other stays in the thread that formed it. kNJ: the 8-wide tiles of a warp's part of a
  // 64-wide product.
  const int a = warp & 3, part = warp >> 2;
  constexpr int kNJ = kChunk / (8 * kChunkParts);

  // 1. Issue every copy, in three groups: what stages 2 and 3 read; h and dh (stages 4 to 6); q
  // and k (the K phase). Rows past the chunk's end: zeros.
  // The chunk's first token row, in rows of one head (of K or V elements).
  const int64_t row0 = cd.row_start * heads + h;
  CopyTileToShared<VD, kChunk, kChunkThreads>(vns, ST, p.vnew + tile * VD * kChunk, kChunk, tid);
  CopyTileToShared<VD, kChunk, kChunkThreads>(dvs, ST, p.ndvnew + tile * VD * kChunk, kChunk, tid);
  CopyTileToShared<kChunk, VD, kChunkThreads>(dos, SV, p.d_o + row0 * VD, heads * VD, tid, len);
  CopyTileToShared<kChunk, VD, kChunkThreads>(vs, SV, p.v + row0 * VD, heads * VD, tid, len);
  CopyTileToShared<kChunk, kChunk, kChunkThreads>(ts, ST, p.tinv + row_base * kChunk, kChunk, tid);
  for (int i = tid; i < KD / 4; i += kChunkThreads)
    CpAsync16(gam + 4 * i, p.gamma + tile * KD + 4 * i);
  CpAsyncCommit();
  CopyTileToShared<VD, KD, kChunkThreads>(hs, SK, p.h + tile * VD * KD, KD, tid);
  CopyTileToShared<VD, KD, kChunkThreads>(dhs, SK, p.dh + tile * VD * KD, KD, tid);
  CpAsyncCommit();
  CopyTileToShared<kChunk, KD, kChunkThreads>(qs, SK, p.q + row0 * KD, heads * KD, tid, len);
  CopyTileToShared<kChunk, KD, kChunkThreads>(ks, SK, p.k + row0 * KD, heads * KD, tid, len);
  CpAsyncCommit();
  // dbk, dgck and rowdot are per-warp slots, each written once below (no zeroing, no atomics:
  // their sums are taken in a fixed order where they are read).
  if (tid < kChunk) {
    bs[tid] = tid < len ? LoadBeta(p.beta + (cd.row_start + tid) * heads + h, tr) : 0.0f;
  }
  CpAsyncWaitPending<2>();
  __syncthreads();

  // 2. dA_qk = dO Vnew^T and dT_v = (dVnew V^T) Diag(beta) (columns j of the part; the A operand
  // is -dVnew, so the product is -dT_v until beta's factor flips it). s dA_qk goes
  // to shared memory as the pairwise terms read it: strictly lower in bf16 (their MMA operand)
  // and the diagonal s dA_qk[r][r] in fp32 apart (it adds s dA_qk[r][r] k_r to dq_r and
  // s dA_qk[r][r] q_r to dk_r, exactly, and nothing to dG). dT_v stays in registers for stage 8.
  float dtv[kNJ][4];
  {
    const int n0 = part * (kChunk / kChunkParts);
    float a1[kNJ][4] = {};
#pragma unroll
    for (int nt = 0; nt < kNJ; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dtv[nt][e] = 0.0f;
    }
#pragma unroll 2
    for (int k0 = 0; k0 < VD; k0 += 16) {
      uint32_t fo[4], fv[4];
      LoadFragA(fo, dos + 16 * a * SV, SV, k0);
      LoadFragAT(fv, dvs, ST, 16 * a, k0);
#pragma unroll
      for (int nt = 0; nt < kNJ; nt += 2) {
        uint32_t fb0[2], fb1[2];
        LoadFragB2(fb0, fb1, vns, ST, k0, n0 + 8 * nt);
        MmaBf16(a1[nt], fo, fb0);
        MmaBf16(a1[nt + 1], fo, fb1);
      }
#pragma unroll
      for (int nt = 0; nt < kNJ; ++nt) {
        uint32_t fb[2];
        LoadFragBT(fb, vs + (n0 + 8 * nt) * SV, SV, k0);
        MmaBf16(dtv[nt], fv, fb);
      }
    }
#pragma unroll
    for (int nt = 0; nt < kNJ; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int r = 16 * a + g8 + (e >> 1) * 8, c = n0 + 8 * nt + 2 * t4;
        const float s0 = scale * a1[nt][e], s1 = scale * a1[nt][e + 1];
        *reinterpret_cast<uint32_t*>(aqs + r * ST + c) =
            PackBf16(c < r ? s0 : 0.0f, c + 1 < r ? s1 : 0.0f);
        if (c == r) aqd[r] = s0;
        if (c + 1 == r) aqd[r] = s1;
        dtv[nt][e] *= -bs[c];
        dtv[nt][e + 1] *= -bs[c + 1];
      }
    }
  }
  // 3. dBv = T^T dVnew (formed as -dBv from -dVnew): dv = beta dBv, dbeta (V part) = sum_v dBv V.
  {
    constexpr int kN = VD / (8 * kChunkParts);
    const int n0 = part * (VD / kChunkParts);
    float ab[kN][4] = {};
    for (int kt = a; kt < kChunk / 16; ++kt) {  // T[m][r] = 0 for m < r
      uint32_t fa[4];
      LoadFragAT(fa, ts, ST, 16 * a, 16 * kt);
#pragma unroll
      for (int nt = 0; nt < kN; ++nt) {
        uint32_t fb[2];
        LoadFragBT(fb, dvs + (n0 + 8 * nt) * ST, ST, 16 * kt);
        MmaBf16(ab[nt], fa, fb);
      }
    }
    float dbv_row[2] = {0.0f, 0.0f};  // rows g8, g8 + 8 of the tile
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int r = 16 * a + g8 + (e >> 1) * 8, c = n0 + 8 * nt + 2 * t4;
        const float b0 = -ab[nt][e], b1 = -ab[nt][e + 1];
        dbv_row[e >> 1] +=
            b0 * __bfloat162float(vs[r * SV + c]) + b1 * __bfloat162float(vs[r * SV + c + 1]);
        if (r < len) {
          *reinterpret_cast<uint32_t*>(p.dv + ((cd.row_start + r) * heads + h) * VD + c) =
              PackBf16(bs[r] * b0, bs[r] * b1);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      dbv_row[i] += __shfl_xor_sync(0xffffffffu, dbv_row[i], 1);
      dbv_row[i] += __shfl_xor_sync(0xffffffffu, dbv_row[i], 2);
    }
    if (t4 == 0) {
      dbv[part * kChunk + 16 * a + g8] = dbv_row[0];
      dbv[part * kChunk + 16 * a + g8 + 8] = dbv_row[1];
    }
  }
  // 4. dQ = dO h^T and dW = -dVnew h^T (columns d of the part), once h and dh are in.
  CpAsyncWaitPending<1>();
  __syncthreads();
  {
    constexpr int kN = KD / (8 * kChunkParts);
    const int n0 = part * (KD / kChunkParts);
    float aq[kN][4] = {}, aw[kN][4] = {};
#pragma unroll 2
    for (int k0 = 0; k0 < VD; k0 += 16) {
      uint32_t fo[4], fv[4];
      LoadFragA(fo, dos + 16 * a * SV, SV, k0);
      LoadFragAT(fv, dvs, ST, 16 * a, k0);
#pragma unroll
      for (int nt = 0; nt < kN; nt += 2) {
        uint32_t fb0[2], fb1[2];
        LoadFragB2(fb0, fb1, hs, SK, k0, n0 + 8 * nt);
        MmaBf16(aq[nt], fo, fb0);
        MmaBf16(aw[nt], fv, fb0);
        MmaBf16(aq[nt + 1], fo, fb1);
        MmaBf16(aw[nt + 1], fv, fb1);
      }
    }
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int r = 16 * a + g8 + (e >> 1) * 8, c = n0 + 8 * nt + 2 * t4;
        *reinterpret_cast<uint32_t*>(dws + r * SK + c) = PackBf16(aw[nt][e], aw[nt][e + 1]);
      }
    }
    if constexpr (L::kOverlay) __syncthreads();
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) {
#pragma unroll
      for (int e2 = 0; e2 < 2; ++e2)
        dqf[(2 * nt + e2) * kChunkThreads + tid] = make_float2(aq[nt][2 * e2], aq[nt][2 * e2 + 1]);
    }
  }
  // 5. dG_C (state part) = gamma sum_v h dh over h^T and dh^T: on the first K / 16 warps, lane
  // (vs, dp) = (lane / 8, lane % 8) sums columns d, d + 1 = 2 (8 warp + dp) + {0, 1} over rows
  // v = 8 i + 2 vs + {0, 1} (the four row groups on different banks), then over vs by shuffles.
  if (warp < KD / 16) {
    const int d = 2 * (8 * warp + (lane & 7)), vs0 = 2 * (lane >> 3);
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll 4
    for (int v = vs0; v < VD; v += 8) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float2 x =
            __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(hs + (v + j) * SK + d));
        const float2 y =
            __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dhs + (v + j) * SK + d));
        s0 = fmaf(x.x, y.x, s0);
        s1 = fmaf(x.y, y.y, s1);
      }
    }
    for (int o = 8; o < 32; o <<= 1) {
      s0 += __shfl_xor_sync(0xffffffffu, s0, o);
      s1 += __shfl_xor_sync(0xffffffffu, s1, o);
    }
    if (lane < 8) {
      dgcv[d] = gam[d] * s0;
      dgcv[d + 1] = gam[d + 1] * s1;
    }
  }
  // The gate's loads go out now (its cumsum lands over h and dh once stage 6 is done with dh).
  ChunkGatePieces<KD, kChunkThreads> gate;
  FetchChunkGate<KD, kChunkThreads>(gate, p.g, cd, heads, h);
  // 6. dKbar = Vnew dh^T (columns d of the part), while the gate's loads are in flight; to shared
  // memory over Vnew and V once every warp is done with them.
  {
    constexpr int kN = KD / (8 * kChunkParts);
    const int n0 = part * (KD / kChunkParts);
    float ak[kN][4] = {};
#pragma unroll 2
    for (int k0 = 0; k0 < VD; k0 += 16) {
      uint32_t fv[4];
      LoadFragAT(fv, vns, ST, 16 * a, k0);
#pragma unroll
      for (int nt = 0; nt < kN; nt += 2) {
        uint32_t fb0[2], fb1[2];
        LoadFragB2(fb0, fb1, dhs, SK, k0, n0 + 8 * nt);
        MmaBf16(ak[nt], fv, fb0);
        MmaBf16(ak[nt + 1], fv, fb1);
      }
    }
    __syncthreads();  // Vnew, V and dh are dead: dKbar goes over Vnew and V, G over h and dh
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) {
#pragma unroll
      for (int e2 = 0; e2 < 2; ++e2)
        dkf[(2 * nt + e2) * kChunkThreads + tid] = make_float2(ak[nt][2 * e2], ak[nt][2 * e2 + 1]);
    }
  }
  // 7. The K phase: the gate's cumsum G (rows past the end: zeros, G flat there), q and k, then
  // beta K e^G and the diagonal tiles' spans.
  CpAsyncWaitAll();  // q and k: visible to all after StoreChunkGate's barriers
  if (l2norm) {
    __syncthreads();
    NormaliseChunkQK<KD, kChunkThreads>(qs, ks, SK, rstd, rstd + kChunk, p.tr.eps);
  }
  StoreChunkGate<KD, kChunkThreads>(G, SG, gate, cd, h, tr);
  StoreBetaKExpG<KD, kChunkThreads>(bks, ks, SK, G, SG, bs);
  if (warp < 4) {
    float span = 0.0f;
    for (int d = lane; d < KD; d += 32)
      span = fmaxf(span, G[16 * warp * SG + d] - G[(16 * warp + 15) * SG + d]);
    for (int o = 16; o > 0; o >>= 1) span = fmaxf(span, __shfl_xor_sync(0xffffffffu, span, o));
    if (lane == 0) diag_mma[warp] = span <= kMaxTileSpan ? 1 : 0;
  }
  __syncthreads();

  // 8. dT = dT_v + dW (beta K e^G)^T.
  {
    const int n0 = part * (kChunk / kChunkParts);
#pragma unroll 2
    for (int k0 = 0; k0 < KD; k0 += 16) {
      uint32_t fa[4];
      LoadFragA(fa, dws + 16 * a * SK, SK, k0);
#pragma unroll
      for (int nt = 0; nt < kNJ; ++nt) {
        uint32_t fb[2];
        LoadFragBT(fb, bks + (n0 + 8 * nt) * SK, SK, k0);
        MmaBf16(dtv[nt], fa, fb);
      }
    }
#pragma unroll
    for (int nt = 0; nt < kNJ; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = 16 * a + g8 + (e >> 1) * 8, c = n0 + 8 * nt + 2 * t4 + (e & 1);
        dts[r * ST + c] = __float2bfloat16(dtv[nt][e]);
      }
    }
  }
  __syncthreads();
  // 9. T^T dT (over dT once every warp has read it).
  {
    const int n0 = part * (kChunk / kChunkParts);
    float acc[kNJ][4] = {};
    for (int kt = a; kt < kChunk / 16; ++kt) {  // T[x][r] = 0 for x < r
      uint32_t fa[4];
      LoadFragAT(fa, ts, ST, 16 * a, 16 * kt);
#pragma unroll
      for (int nt = 0; nt < kNJ; ++nt) {
        uint32_t fb[2];
        LoadFragB(fb, dts, ST, 16 * kt, n0 + 8 * nt);
        MmaBf16(acc[nt], fa, fb);
      }
    }
    __syncthreads();
#pragma unroll
    for (int nt = 0; nt < kNJ; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = 16 * a + g8 + (e >> 1) * 8, c = n0 + 8 * nt + 2 * t4 + (e & 1);
        dts[r * ST + c] = __float2bfloat16(acc[nt][e]);
      }
    }
  }
  __syncthreads();
  // 10. dA_kk = -(T^T dT) T^T, strictly lower.
  {
    const int n0 = part * (kChunk / kChunkParts);
    float acc[kNJ][4] = {};
#pragma unroll
    for (int kt = 0; kt < kChunk / 16; ++kt) {
      uint32_t fa[4];
      LoadFragA(fa, dts + 16 * a * ST, ST, 16 * kt);
#pragma unroll
      for (int nt = 0; nt < kNJ; ++nt) {
        uint32_t fb[2];
        LoadFragBT(fb, ts + (n0 + 8 * nt) * ST, ST, 16 * kt);
        MmaBf16(acc[nt], fa, fb);
      }
    }
#pragma unroll
    for (int nt = 0; nt < kNJ; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = 16 * a + g8 + (e >> 1) * 8, c = n0 + 8 * nt + 2 * t4 + (e & 1);
        aks[r * ST + c] = __float2bfloat16(c < r ? -acc[nt][e] : 0.0f);
      }
    }
  }
  __syncthreads();

  // 11. Per block of kNB 8-wide column tiles of the warp's part of K: dBk = T^T dW, the pairwise
  // row side (tiles 0..a against reference row 16 a) and column side (tiles a..3 against reference
  // row 16 a + 15), the element-wise terms; dq and dk go out, dG is kept for the cumsum.
  constexpr int kNB = 2, kCB = KD / (8 * kNB * kChunkParts);
  static_assert(kNB == 2, "q and k of a block: one x4 ldmatrix per row tile (LoadFragB2)");
  const int ref = 16 * a, mref = 16 * a + 15;
  const bool mma_diag = diag_mma[a] != 0;
  float dbeta_part[2] = {0.0f, 0.0f}, qdot_part[2] = {0.0f, 0.0f}, kdot_part[2] = {0.0f, 0.0f};
  // Not unrolled: one copy of this code, not one per block (the kernel's code must stay within
  // the instruction cache; unrolled, a third of the kernel's time went to instruction fetch).
  // dG of the block waits in the thread's dQ slots, read just before (G is still being read).
#pragma unroll 1
  for (int cb = 0; cb < kCB; ++cb) {
    const int n0 = part * (KD / kChunkParts) + 8 * kNB * cb;
    float bk_acc[kNB][4] = {}, pq[kNB][4] = {}, pk[kNB][4] = {}, js[kNB][4] = {};
    // This thread's dQ and dKbar of the block (stages 4 and 6 formed them at the same rows and
    // columns), read now so that their latency hides behind the products below.
    float2 dqs_in[kNB][2], dkb_in[kNB][2];
#pragma unroll
    for (int nt = 0; nt < kNB; ++nt) {
#pragma unroll
      for (int e2 = 0; e2 < 2; ++e2) {
        const int i = (2 * (kNB * cb + nt) + e2) * kChunkThreads + tid;
        dqs_in[nt][e2] = dqf[i];
        dkb_in[nt][e2] = dkf[i];
      }
    }
    for (int kt = a; kt < kChunk / 16; ++kt) {
      uint32_t fa[4];
      LoadFragAT(fa, ts, ST, 16 * a, 16 * kt);
#pragma unroll
      for (int nt = 0; nt < kNB; ++nt) {
        uint32_t fb[2];
        LoadFragB(fb, dws, SK, 16 * kt, n0 + 8 * nt);
        MmaBf16(bk_acc[nt], fa, fb);
      }
    }
    // Row side: Y[j][d] = k_jd 2^{G_ref,d - G_jd}. k comes in the B fragments' layout (rows j,
    // j + 1 of column d packed in one register, for the block's two column tiles in one
    // ldmatrix), the factors per element.
    const int kt_row_end = mma_diag ? a + 1 : a;
    for (int kt = 0; kt < kt_row_end; ++kt) {
      uint32_t faq[4], fak[4], kf[kNB][2];
      LoadFragA(faq, aqs + 16 * a * ST, ST, 16 * kt);
      LoadFragA(fak, aks + 16 * a * ST, ST, 16 * kt);
      LoadFragB2(kf[0], kf[1], ks, SK, 16 * kt, n0);
#pragma unroll
      for (int nt = 0; nt < kNB; ++nt) {
        const int d = n0 + 8 * nt + g8;
        const float gref = G[ref * SG + d];
        uint32_t yh[2], yl[2];
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const int j = 16 * kt + 2 * t4 + 8 * jj;
          const float2 k2 = UnpackBf16x2(kf[nt][jj]);
          PackBf16Split(k2.x * Exp2Ftz(gref - G[j * SG + d]),
                        k2.y * Exp2Ftz(gref - G[(j + 1) * SG + d]), yh[jj], yl[jj]);
        }
        MmaBf16(pq[nt], faq, yh);
        MmaBf16(pq[nt], faq, yl);
        MmaBf16(pk[nt], fak, yh);
        MmaBf16(pk[nt], fak, yl);
      }
    }
    // Column side: X_q[r][d] = q_rd 2^{G_rd - G_mref,d}, X_k = beta_r k_rd 2^{G_rd - G_mref,d}.
    for (int kt = mma_diag ? a : a + 1; kt < kChunk / 16; ++kt) {
      uint32_t faq[4], fak[4], qf[kNB][2], kf[kNB][2];
      LoadFragAT(faq, aqs, ST, 16 * a, 16 * kt);
      LoadFragAT(fak, aks, ST, 16 * a, 16 * kt);
      LoadFragB2(qf[0], qf[1], qs, SK, 16 * kt, n0);
      LoadFragB2(kf[0], kf[1], ks, SK, 16 * kt, n0);
#pragma unroll
      for (int nt = 0; nt < kNB; ++nt) {
        const int d = n0 + 8 * nt + g8;
        const float gm = G[mref * SG + d];
        uint32_t xqh[2], xql[2], xkh[2], xkl[2];
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const int r = 16 * kt + 2 * t4 + 8 * jj;
          const float e0 = Exp2Ftz(G[r * SG + d] - gm), e1 = Exp2Ftz(G[(r + 1) * SG + d] - gm);
          const float2 q2 = UnpackBf16x2(qf[nt][jj]), k2 = UnpackBf16x2(kf[nt][jj]);
          const float2 b2 = *reinterpret_cast<const float2*>(bs + r);
          PackBf16Split(q2.x * e0, q2.y * e1, xqh[jj], xql[jj]);
          PackBf16Split(b2.x * k2.x * e0, b2.y * k2.y * e1, xkh[jj], xkl[jj]);
        }
        MmaBf16(js[nt], faq, xqh);
        MmaBf16(js[nt], faq, xql);
        MmaBf16(js[nt], fak, xkh);
        MmaBf16(js[nt], fak, xkl);
      }
    }
    // A diagonal tile past kMaxTileSpan: its pairwise terms in fp32 with exponents <= 0, for
    // the block's 4 kNB elements in one loop (one copy of this code, not one per unrolled element
    // below: those copies overflowed the instruction cache). fb is read only on this path.
    float fb[3][4 * kNB];
    if (!mma_diag) {
#pragma unroll 1
      for (int i = 0; i < 4 * kNB; ++i) {
        const int e = i & 3;
        const int r = 16 * a + g8 + (e >> 1) * 8, d = n0 + 8 * (i >> 2) + 2 * t4 + (e & 1);
        const float gr = G[r * SG + d];
        float sq = 0.0f, sk = 0.0f, sj = 0.0f;
        for (int j = ref; j <= r; ++j) {
          const float kj = __bfloat162float(ks[j * SK + d]) * Exp2Ftz(gr - G[j * SG + d]);
          sq += __bfloat162float(aqs[r * ST + j]) * kj;
          sk += __bfloat162float(aks[r * ST + j]) * kj;
        }
        for (int rr = r; rr <= mref; ++rr) {
          const float ex = Exp2Ftz(G[rr * SG + d] - gr);
          sj += (__bfloat162float(aqs[rr * ST + r]) * __bfloat162float(qs[rr * SK + d]) +
                 __bfloat162float(aks[rr * ST + r]) * bs[rr] * __bfloat162float(ks[rr * SK + d])) *
                ex;
        }
        fb[0][i] = sq;
        fb[1][i] = sk;
        fb[2][i] = sj;
      }
    }
    // Element-wise terms and the outputs.
#pragma unroll
    for (int nt = 0; nt < kNB; ++nt) {
      float dq_out[4], dk_out[4], dg_out[4], dgc_part[2] = {0.0f, 0.0f};
      // What the thread's accumulator elements read, two columns at a time: G at the reference
      // rows and the chunk's last row (per column), G, q and k at its two rows.
      const int dc = n0 + 8 * nt + 2 * t4;
      const float2 gref2 = *reinterpret_cast<const float2*>(G + ref * SG + dc);
      const float2 gm2 = *reinterpret_cast<const float2*>(G + mref * SG + dc);
      const float2 gl2 = *reinterpret_cast<const float2*>(G + (kChunk - 1) * SG + dc);
      float2 gr2[2], qr2[2], kr2[2];
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int r = 16 * a + g8 + 8 * h2;
        gr2[h2] = *reinterpret_cast<const float2*>(G + r * SG + dc);
        qr2[h2] = UnpackBf16x2(*reinterpret_cast<const uint32_t*>(qs + r * SK + dc));
        kr2[h2] = UnpackBf16x2(*reinterpret_cast<const uint32_t*>(ks + r * SK + dc));
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = 16 * a + g8 + (e >> 1) * 8;
        const bool y = (e & 1) != 0;
        const float gr = y ? gr2[e >> 1].y : gr2[e >> 1].x;
        const float gref = y ? gref2.y : gref2.x, gm = y ? gm2.y : gm2.x, gl = y ? gl2.y : gl2.x;
        float dqp = Exp2Ftz(gr - gref) * pq[nt][e];
        float pkv = Exp2Ftz(gr - gref) * pk[nt][e];
        float dkj = Exp2Ftz(gm - gr) * js[nt][e];
        if (!mma_diag) {
          dqp += fb[0][4 * nt + e];
          pkv += fb[1][4 * nt + e];
          dkj += fb[2][4 * nt + e];
        }
        const float qv = y ? qr2[e >> 1].y : qr2[e >> 1].x, kv = y ? kr2[e >> 1].y : kr2[e >> 1].x;
        const float br = bs[r];
        const float eg = Exp2Ftz(gr), ebar = Exp2Ftz(gl - gr);
        const float dqs = y ? dqs_in[nt][e >> 1].y : dqs_in[nt][e >> 1].x;
        const float dkb = y ? dkb_in[nt][e >> 1].y : dkb_in[nt][e >> 1].x;
        const float dbk = bk_acc[nt][e];
        dq_out[e] = scale * eg * dqs + dqp + aqd[r] * kv;
        dk_out[e] = br * dbk * eg + dkb * ebar + br * pkv + dkj + aqd[r] * qv;
        dg_out[e] = scale * dqs * qv * eg + br * dbk * kv * eg - dkb * kv * ebar + qv * dqp +
                    kv * br * pkv - kv * dkj;
        dbeta_part[e >> 1] += dbk * kv * eg + kv * pkv;
        dgc_part[e & 1] += dkb * kv * ebar;
      }
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int r = 16 * a + g8 + (e >> 1) * 8, d = n0 + 8 * nt + 2 * t4;
        const uint32_t dq2 = PackBf16(dq_out[e], dq_out[e + 1]);
        const uint32_t dk2 = PackBf16(dk_out[e], dk_out[e + 1]);
        if constexpr (kTransforms) {
          // Gradients w.r.t. the normalised rows, rounded to bf16 (as the unfused op passed them
          // on), wait in this thread's dKbar slots (read above) for the rows' dot products (the
          // same code with the norm off, so that this loop is not compiled twice).
          reinterpret_cast<uint2*>(dkf)[(2 * (kNB * cb + nt) + (e >> 1)) * kChunkThreads + tid] =
              make_uint2(dq2, dk2);
          const float2 q2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&dq2));
          const float2 k2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&dk2));
          const float2 qh =
              __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(qs + r * SK + d));
          const float2 kh =
              __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(ks + r * SK + d));
          qdot_part[e >> 1] += qh.x * q2.x + qh.y * q2.y;
          kdot_part[e >> 1] += kh.x * k2.x + kh.y * k2.y;
        } else if (r < len) {
          const int64_t off = ((cd.row_start + r) * heads + h) * KD + d;
          *reinterpret_cast<uint32_t*>(p.dq + off) = dq2;
          *reinterpret_cast<uint32_t*>(p.dk + off) = dk2;
        }
        dqf[(2 * (kNB * cb + nt) + (e >> 1)) * kChunkThreads + tid] =
            make_float2(dg_out[e], dg_out[e + 1]);
      }
      // dG_C's Kbar part: sum over the 16 rows of the tile (lanes with the same t4).
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        for (int o = 4; o < 32; o <<= 1)
          dgc_part[i] += __shfl_xor_sync(0xffffffffu, dgc_part[i], o);
      }
      if (g8 == 0) {  // the row tile's slot: the 4 tiles of a column part share its columns
        *reinterpret_cast<float2*>(dgck + a * KD + n0 + 8 * nt + 2 * t4) =
            make_float2(dgc_part[0], dgc_part[1]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    dbeta_part[i] += __shfl_xor_sync(0xffffffffu, dbeta_part[i], 1);
    dbeta_part[i] += __shfl_xor_sync(0xffffffffu, dbeta_part[i], 2);
  }
  if (t4 == 0) {  // the column part's slot: the parts of a row tile share its rows
    dbk[part * kChunk + 16 * a + g8] = dbeta_part[0];
    dbk[part * kChunk + 16 * a + g8 + 8] = dbeta_part[1];
  }
  static_assert(kChunkThreads >= 2 * KD, "a thread per column and half");
  if constexpr (kTransforms) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      for (int o = 1; o < 4; o <<= 1) {
        qdot_part[i] += __shfl_xor_sync(0xffffffffu, qdot_part[i], o);
        kdot_part[i] += __shfl_xor_sync(0xffffffffu, kdot_part[i], o);
      }
      if (t4 == 0) {  // the column part's slot
        rowdot[part * 2 * kChunk + 16 * a + g8 + 8 * i] = qdot_part[i];
        rowdot[part * 2 * kChunk + kChunk + 16 * a + g8 + 8 * i] = kdot_part[i];
      }
    }
  }
  __syncthreads();  // G is dead: dG goes over it
  // With the gate, row i of the half (tid / K) that cumsum thread tid < 2 K sums lies at this
  // float of the dQ slots (its raw input z, then dg/dz) and of the dK slots (dg/dA_log).
  auto gate_slot = [tid](int i) { return 2 * ((i >> 1) * 2 * KD + tid) + (i & 1); };
#pragma unroll
  for (int nt = 0; nt < KD / (8 * kChunkParts); ++nt) {
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2) {
      const int r = 16 * a + g8 + 8 * e2, d = part * (KD / kChunkParts) + 8 * nt + 2 * t4;
      *reinterpret_cast<float2*>(dGs + r * SG + d) = dqf[(2 * nt + e2) * kChunkThreads + tid];
    }
  }
  if constexpr (kTransforms) {
    // With the gate: the raw input at the rows and column this thread's dg cumsum below stores,
    // fetched now (all loads in flight at once, behind the dq / dk pass) into the dQ slots, free
    // once every thread has moved its dG out (at K = 64 a thread's 32 values span other
    // threads' slots); in the cumsum's loop each load would wait in full (its stores might alias
    // them).
    if (p.tr.gate) __syncthreads();
    if (p.tr.gate && tid < 2 * KD) {
      const int r0 = (tid / KD) * (kChunk / 2);
      const GIn* zp = p.g + ((cd.row_start + r0) * heads + h) * KD + tid % KD;
      const int64_t zs = static_cast<int64_t>(heads) * KD;
      if (r0 + kChunk / 2 <= len) {
        float z[kChunk / 2];
#pragma unroll
        for (int i = 0; i < kChunk / 2; ++i) z[i] = LoadF(zp + i * zs);
#pragma unroll
        for (int m = 0; m < kChunk / 4; ++m)
          dqf[m * 2 * KD + tid] = make_float2(z[2 * m], z[2 * m + 1]);
      } else {  // the sequence's last chunk
        float* zf = reinterpret_cast<float*>(dqf);
#pragma unroll 1
        for (int i = 0; i < len - r0; ++i) zf[gate_slot(i)] = LoadF(zp + i * zs);
      }
    }
  }
  if constexpr (kTransforms) {
    // dq = rstd (dq^ - q^ <q^, dq^>) and the same for dk (the L2 norm's chain rule; as they are
    // with it off). Unrolled, the row terms and addresses hoisted out of the column loop: rolled,
    // it and the gate's fetch before it were a tenth of the transforms kernel's instructions,
    // mostly index arithmetic (measured).
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2) {
      const int r = 16 * a + g8 + 8 * e2, d0 = part * (KD / kChunkParts) + 2 * t4;
      if (r >= len) continue;
      const float rq = l2norm ? rstd[r] : 1.0f, rk = l2norm ? rstd[kChunk + r] : 1.0f;
      float qd = 0.0f, kd = 0.0f;  // the column parts' dots, in part order
      if (l2norm) {
#pragma unroll
        for (int q = 0; q < kChunkParts; ++q) {
          qd += rowdot[q * 2 * kChunk + r];
          kd += rowdot[q * 2 * kChunk + kChunk + r];
        }
      }
      const int64_t off = ((cd.row_start + r) * heads + h) * KD + d0;
      uint32_t* dq_row = reinterpret_cast<uint32_t*>(p.dq + off);
      uint32_t* dk_row = reinterpret_cast<uint32_t*>(p.dk + off);
      const uint32_t* q_row = reinterpret_cast<const uint32_t*>(qs + r * SK + d0);
      const uint32_t* k_row = reinterpret_cast<const uint32_t*>(ks + r * SK + d0);
#pragma unroll
      for (int nt = 0; nt < KD / (8 * kChunkParts); ++nt) {
        const uint2 x = reinterpret_cast<const uint2*>(dkf)[(2 * nt + e2) * kChunkThreads + tid];
        const float2 dq2 = UnpackBf16x2(x.x), dk2 = UnpackBf16x2(x.y);
        const float2 qh = UnpackBf16x2(q_row[4 * nt]), kh = UnpackBf16x2(k_row[4 * nt]);
        dq_row[4 * nt] = PackBf16(rq * (dq2.x - qh.x * qd), rq * (dq2.y - qh.y * qd));
        dk_row[4 * nt] = PackBf16(rk * (dk2.x - kh.x * kd), rk * (dk2.y - kh.y * kd));
      }
    }
  }
  __syncthreads();
  if (kTransforms && p.tr.gate) {
    // The gate's derivatives at every element, by the whole block (formed in the cumsum's loop
    // below they ran on its 2 K threads only, one block per multiprocessor): dg/dz over z in the
    // dQ slots, dg/dA_log into the dK slots at the same index (free once dq and dk are out). Slot
    // (m, o) holds rows 2 m, 2 m + 1 of the half o / K of column o % K; the 2 K cumsum threads own
    // them, each slot goes to one thread here.
    constexpr int kOwners = 2 * KD, kShare = kChunkThreads / kOwners;  // threads per owner
    constexpr int kSlots = kChunk / 4 / kShare;                        // float2 slots per thread
    static_assert(kChunkThreads % kOwners == 0 && kChunk / 4 % kShare == 0, "even shares");
    const int o = tid % kOwners, m0 = (tid / kOwners) * kSlots;
    const float ea = p.tr.a_log != nullptr ? __expf(p.tr.a_log[h]) : 1.0f;
    const float b = p.tr.dt_bias != nullptr ? p.tr.dt_bias[h * KD + o % KD] : 0.0f;
#pragma unroll
    for (int m = m0; m < m0 + kSlots; ++m) {
      const float2 z2 = dqf[m * kOwners + o];
      float2 dx, da;
      KdaGateGrad(z2.x + b, ea, p.tr.bounded, p.tr.g_min, &dx.x, &da.x);
      KdaGateGrad(z2.y + b, ea, p.tr.bounded, p.tr.g_min, &dx.y, &da.y);
      dqf[m * kOwners + o] = dx;
      dkf[m * kOwners + o] = da;
    }
    __syncthreads();
  }
  if (tid < len) {
    float db = 0.0f;
#pragma unroll
    for (int q = 0; q < kChunkParts; ++q) db += dbv[q * kChunk + tid];
#pragma unroll
    for (int q = 0; q < kChunkParts; ++q) db += dbk[q * kChunk + tid];
    if (kTransforms && p.tr.beta_sigmoid) db *= bs[tid] * (1.0f - bs[tid]);  // the sigmoid's
    StoreF(p.dbeta + (cd.row_start + tid) * heads + h, db);
  }
  // dg = reverse cumsum of dG, starting from the chunk-end terms, the two halves of the rows at
  // once: thread d + K c stores column d's rows [32 c, 32 c + 32); for c = 0 it first runs the
  // same chain over rows 63 .. 32 without storing (the identical sums, in the same order: dg is
  // a small remainder of large terms, so the order is kept).
  if (tid < 2 * KD) {
    const int d = tid % KD, hi = kChunk / 2;
    float kbar_part = dgck[d];  // the row tiles' parts, in tile order
#pragma unroll
    for (int t = 1; t < 4; ++t) kbar_part += dgck[t * KD + d];
    float acc = dgcv[d] + kbar_part;
    int r = len - 1;
    if (tid < KD) {
      for (; r >= hi; --r) acc += dGs[r * SG + d];
    }
    const int r_end = tid < KD ? 0 : hi;
    if (kTransforms && p.tr.gate) {
      // dz = dg dg/dz (the derivatives formed above), and the column's share of ddt_bias and
      // da_log: per thread (column and half) and per warp into the block's gate sums.
      const float* dxs = reinterpret_cast<const float*>(dqf);
      const float* das = reinterpret_cast<const float*>(dkf);
      float db = 0.0f, da = 0.0f;
      for (; r >= r_end; --r) {
        acc += dGs[r * SG + d];
        const int slot = gate_slot(r - (tid / KD) * (kChunk / 2));
        const float dz = acc * dxs[slot];
        StoreF(p.dg + ((cd.row_start + r) * heads + h) * KD + d, dz);
        db += dz;
        da += acc * das[slot];
      }
      gsum[tid] = db;
      for (int o = 16; o > 0; o >>= 1) da += __shfl_xor_sync(0xffffffffu, da, o);
      if (lane == 0) gsum[2 * KD + warp] = da;
    } else {
      for (; r >= r_end; --r) {
        acc += dGs[r * SG + d];
        StoreF(p.dg + ((cd.row_start + r) * heads + h) * KD + d, acc);
      }
    }
  }
  if constexpr (kTransforms) {
    if (p.tr.gate) {  // the block's gate sums, in a fixed order, to its (chunk, head) slots
      __syncthreads();
      const int64_t slot = static_cast<int64_t>(blockIdx.x) * heads + h;
      if (p.ddt_bias_parts != nullptr && tid < KD) {
        p.ddt_bias_parts[slot * KD + tid] = gsum[tid] + gsum[KD + tid];
      }
      if (p.da_log_parts != nullptr && tid == 0) {
        float da = gsum[2 * KD];
        for (int w = 1; w < 2 * KD / 32; ++w) da += gsum[2 * KD + w];
        p.da_log_parts[slot] = da;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.

// A forward record the caller kept must describe this problem: its chunks and tensor shapes.
Status CheckKept(const KdaProblem& p, const KdaTcSaved& kept, int64_t kd, int64_t vd) {
  int64_t chunks = 0;
  for (int64_t n = 0; n < p.num_sequences(); ++n) {
    chunks += (p.seq_start[n + 1] - p.seq_start[n] + kChunk - 1) / kChunk;
  }
  const Shape h = {chunks, p.heads, vd, kd};
  const bool transitions_ok = kept.segments_per_sequence <= 1 ||
                              (kept.transitions.defined() && kept.transitions.dim(1) == p.heads &&
                               kept.transitions.dim(3) == vd + kd);
  if (kept.chunks != chunks || kept.h.shape() != h ||
      kept.w.shape() != Shape{chunks, p.heads, kChunk, kd} || !kept.tinv.defined() ||
      !kept.vnew.defined() || !transitions_ok) {
    return InvalidArgumentError("kda backward: the kept forward intermediates hold states " +
                                ShapeToString(kept.h.shape()) + ", these inputs need " +
                                ShapeToString(h) + " (keep them from a forward of these inputs)");
  }
  return Status::OK();
}

template <int KD, int VD, typename GIn>
Status RunBackwardTc(const KdaProblem& p, const KdaInputs& in, const Tensor& d_o,
                     const KdaTcSaved* kept, const Tensor& d_final_state, const KdaTcTuning& tuning,
                     KdaGrads* grads, const KdaInputTransforms* fused) {
  const Device dev = p.device;
  const int64_t n_seq = p.num_sequences(), heads = p.heads, kd = KD, vd = VD, ck = kChunk;
  grads->dinitial_state = Tensor();
  ORRERY_ASSIGN_OR_RETURN(grads->dq, Tensor::Allocate(in.q.shape(), in.q.dtype(), dev));
  ORRERY_ASSIGN_OR_RETURN(grads->dk, Tensor::Allocate(in.k.shape(), in.k.dtype(), dev));
  ORRERY_ASSIGN_OR_RETURN(grads->dv, Tensor::Allocate(in.v.shape(), in.v.dtype(), dev));
  ORRERY_ASSIGN_OR_RETURN(grads->dg, Tensor::Allocate(in.g.shape(), in.g.dtype(), dev));
  ORRERY_ASSIGN_OR_RETURN(grads->dbeta, Tensor::Allocate(in.beta.shape(), in.beta.dtype(), dev));
  if (in.initial_state.defined()) {
    ORRERY_ASSIGN_OR_RETURN(grads->dinitial_state,
                            Tensor::Allocate(in.initial_state.shape(), DType::kF32, dev));
  }
  if (fused != nullptr && fused->gate)
    ORRERY_RETURN_IF_ERROR(AllocateGateParamGrads(in, dev, grads));

  // 1. The forward, keeping what the backward reads (unless the caller's forward kept it).
  KdaTcSaved recomputed;
  if (kept == nullptr) {
    KdaOutputs none;
    ORRERY_RETURN_IF_ERROR(LaunchKdaForwardTc(p, in, tuning, &none, &recomputed, fused));
  } else {
    ORRERY_RETURN_IF_ERROR(CheckKept(p, *kept, KD, VD));
  }
  const KdaTcSaved& saved = kept != nullptr ? *kept : recomputed;
  if (tuning.backward_stages == 1) return Status::OK();
  const int64_t chunks = saved.chunks;
  const ChunkDesc* chunk_desc =
      reinterpret_cast<const ChunkDesc*>(saved.chunk_table.data<int64_t>());

  // 2. The reverse state pass over the forward's segments, listed per sequence from its last
  // chunk range to its first, so that the combine (which walks a sequence's segments in list
  // order) chains dS backwards in time from dht. The tables go to the device in one copy before
  // the first kernel.
  const KdaSegmentSplit fwd_segments =
      SplitKdaSegments(saved.seq_chunk_first, saved.segments_per_sequence);
  const bool split = saved.segments_per_sequence > 1;
  const int64_t total_segs = static_cast<int64_t>(fwd_segments.ranges.size());
  const int64_t state_elems = heads * kd * vd;
  ORRERY_ASSIGN_OR_RETURN(Tensor ndvnew,
                          Tensor::Allocate({chunks, heads, vd, ck}, DType::kBF16, dev));
  ORRERY_ASSIGN_OR_RETURN(Tensor dh, Tensor::Allocate({chunks, heads, vd, kd}, DType::kBF16, dev));
  Tensor ext, seg_end;
  if (split) {
    ORRERY_ASSIGN_OR_RETURN(ext, Tensor::Allocate({total_segs, heads, kd, vd}, DType::kF32, dev));
    ORRERY_ASSIGN_OR_RETURN(seg_end,
                            Tensor::Allocate({total_segs, heads, kd, vd}, DType::kF32, dev));
  }
  const float* dht = d_final_state.defined() ? d_final_state.data<float>() : nullptr;
  float* dh0 = grads->dinitial_state.defined() ? grads->dinitial_state.data<float>() : nullptr;
  std::vector<int64_t> pass1, pass2;
  for (int64_t n = 0; n < n_seq; ++n) {
    const int64_t first = fwd_segments.seq_first[n], last = fwd_segments.seq_first[n + 1] - 1;
    for (int64_t f = last; f >= first; --f) {  // f: the forward's index; s: the list's
      const int64_t s = first + last - f;
      const auto range = fwd_segments.ranges[f];
      float* out_dh0 = f == first && dh0 != nullptr ? dh0 + n * state_elems : nullptr;
      if (!split) {
        AppendSegmentDesc(&pass2, range, dht != nullptr ? dht + n * state_elems : nullptr, out_dh0);
        continue;
      }
      if (f != first)
        AppendSegmentDesc(&pass1, range, nullptr, ext.data<float>() + s * state_elems);
      AppendSegmentDesc(&pass2, range, seg_end.data<float>() + s * state_elems, out_dh0);
    }
  }
  ORRERY_ASSIGN_OR_RETURN(const KdaSegmentTables tables,
                          UploadKdaSegmentTables(pass2, pass1, fwd_segments.seq_first, dev));
  RevParams rev;
  rev.w = static_cast<const bf16*>(saved.w.raw_data());
  rev.qg = static_cast<const bf16*>(saved.qg.raw_data());
  rev.kbar_t = static_cast<const bf16*>(saved.kbar_t.raw_data());
  rev.aqk = static_cast<const bf16*>(saved.aqk.raw_data());
  rev.gamma = saved.gamma.data<float>();
  rev.d_o = static_cast<const bf16*>(d_o.raw_data());
  rev.chunks = chunk_desc;
  rev.ndvnew = nullptr;
  rev.dh = nullptr;
  rev.heads = static_cast<int>(heads);
  rev.vd = VD;
  // One V slice per block: two to a block (sharing their copies, as the forward pass does)
  // measured slower here (docs/benchmarks.md, session 6).
  const size_t rev_smem = StatePassSmem<KD, 1>::kBytes;
  ORRERY_RETURN_IF_ERROR(AllowSmem(KdaReverseStatePassKernel<KD>, rev_smem));
  if (!pass1.empty()) {
    RevParams r1 = rev;
    r1.segments = tables.first_pass;
    const dim3 grid(static_cast<unsigned>(pass1.size() / kSegmentDescWords),
                    static_cast<unsigned>(heads), VD / kSliceV);
    KdaReverseStatePassKernel<KD><<<grid, kPassThreads, rev_smem>>>(r1);
    ORRERY_RETURN_IF_ERROR(CudaCheck(cudaGetLastError(), "reverse state pass 1 launch"));
  }
  if (split) {
    SegmentCombineArgs combine;
    combine.seq_segment_first = tables.seq_segment_first;
    combine.ext = ext.data<float>();
    combine.ext_ld = vd;
    combine.trans = saved.transitions.data<float>() + vd;
    combine.trans_ld = vd + kd;
    combine.backward = true;
    combine.init = dht;
    combine.seg_start = seg_end.data<float>();
    ORRERY_RETURN_IF_ERROR(LaunchKdaSegmentCombine(KD, VD, n_seq, heads, combine));
  }
  RevParams r2 = rev;
  r2.segments = tables.output_pass;
  r2.ndvnew = static_cast<bf16*>(ndvnew.raw_data());
  r2.dh = static_cast<bf16*>(dh.raw_data());
  {
    const dim3 grid(static_cast<unsigned>(total_segs), static_cast<unsigned>(heads), VD / kSliceV);
    KdaReverseStatePassKernel<KD><<<grid, kPassThreads, rev_smem>>>(r2);
    ORRERY_RETURN_IF_ERROR(CudaCheck(cudaGetLastError(), "reverse state pass launch"));
  }
  if (tuning.backward_stages == 2 || chunks == 0) {
    return CudaCheck(cudaDeviceSynchronize(), "tensor-core backward");
  }

  // 3. The chunk kernel: the products over V, then T, A_kk, the pairwise and element-wise terms.
  {
    ChunkParams<GIn> cp;
    cp.q = static_cast<const bf16*>(in.q.raw_data());
    cp.k = static_cast<const bf16*>(in.k.raw_data());
    cp.v = static_cast<const bf16*>(in.v.raw_data());
    cp.beta = static_cast<const bf16*>(in.beta.raw_data());
    cp.d_o = static_cast<const bf16*>(d_o.raw_data());
    cp.g = static_cast<const GIn*>(in.g.raw_data());
    cp.h = static_cast<const bf16*>(saved.h.raw_data());
    cp.dh = static_cast<const bf16*>(dh.raw_data());
    cp.vnew = static_cast<const bf16*>(saved.vnew.raw_data());
    cp.ndvnew = static_cast<const bf16*>(ndvnew.raw_data());
    cp.tinv = static_cast<const bf16*>(saved.tinv.raw_data());
    cp.gamma = saved.gamma.data<float>();
    cp.chunks = chunk_desc;
    cp.dq = static_cast<bf16*>(grads->dq.raw_data());
    cp.dk = static_cast<bf16*>(grads->dk.raw_data());
    cp.dv = static_cast<bf16*>(grads->dv.raw_data());
    cp.dbeta = static_cast<bf16*>(grads->dbeta.raw_data());
    cp.dg = static_cast<GIn*>(grads->dg.raw_data());
    cp.heads = static_cast<int>(heads);
    cp.scale = p.scale;
    if (fused != nullptr) cp.tr = MakeChunkInputTransforms(*fused, in);
    // The gate parameters' gradients: each block's share to its slot, then the fixed-order sums
    // over the chunks (column_sums.h) into the zeroed gradients.
    const bool gate_params = fused != nullptr && fused->gate;
    Tensor da_log_parts, ddt_bias_parts;
    if (gate_params && grads->da_log.defined()) {
      ORRERY_ASSIGN_OR_RETURN(da_log_parts, Tensor::Allocate({chunks, heads}, DType::kF32, dev));
    }
    if (gate_params && grads->ddt_bias.defined()) {
      ORRERY_ASSIGN_OR_RETURN(ddt_bias_parts,
                              Tensor::Allocate({chunks, heads * kd}, DType::kF32, dev));
    }
    cp.da_log_parts = da_log_parts.defined() ? da_log_parts.data<float>() : nullptr;
    cp.ddt_bias_parts = ddt_bias_parts.defined() ? ddt_bias_parts.data<float>() : nullptr;
    const size_t smem = ChunkSmem<KD, VD>::kBytes;
    auto kernel = fused != nullptr ? KdaBackwardChunkKernel<KD, VD, GIn, true>
                                   : KdaBackwardChunkKernel<KD, VD, GIn, false>;
    ORRERY_RETURN_IF_ERROR(AllowSmem(kernel, smem));
    const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(heads));
    kernel<<<grid, kChunkThreads, smem>>>(cp);
    ORRERY_RETURN_IF_ERROR(CudaCheck(cudaGetLastError(), "backward chunk kernel launch"));
    if (gate_params) {
      ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(dev.index));
      if (da_log_parts.defined()) {
        ORRERY_RETURN_IF_ERROR(LaunchColumnSums(da_log_parts.data<float>(), chunks, heads, true,
                                                grads->da_log.data<float>(), ctx->stream()));
      }
      if (ddt_bias_parts.defined()) {
        ORRERY_RETURN_IF_ERROR(LaunchColumnSums(ddt_bias_parts.data<float>(), chunks, heads * kd,
                                                true, grads->ddt_bias.data<float>(),
                                                ctx->stream()));
      }
    }
  }
  // The scratch tensors go back to the device's block cache when this returns, while the kernels
  // may still run: whatever takes those blocks next is queued after them on the same stream.
  return Status::OK();
}

template <typename GIn>
Status DispatchBackwardTc(const KdaProblem& p, const KdaInputs& in, const Tensor& d_o,
                          const KdaTcSaved* kept, const Tensor& dht, const KdaTcTuning& tuning,
                          KdaGrads* grads, const KdaInputTransforms* fused) {
  if (p.key_dim == 128 && p.value_dim == 128) {
    return RunBackwardTc<128, 128, GIn>(p, in, d_o, kept, dht, tuning, grads, fused);
  }
  if (p.key_dim == 128 && p.value_dim == 64) {
    return RunBackwardTc<128, 64, GIn>(p, in, d_o, kept, dht, tuning, grads, fused);
  }
  if (p.key_dim == 64 && p.value_dim == 128) {
    return RunBackwardTc<64, 128, GIn>(p, in, d_o, kept, dht, tuning, grads, fused);
  }
  return RunBackwardTc<64, 64, GIn>(p, in, d_o, kept, dht, tuning, grads, fused);
}

}  // namespace

Status LaunchKdaBackwardTc(const KdaProblem& p, const KdaInputs& in, const Tensor& d_o,
                           const Tensor& d_final_state, const KdaTcTuning& tuning, KdaGrads* grads,
                           const KdaTcSaved* kept, const KdaInputTransforms* fused) {
  if (!KdaTcSupported(p, in)) {
    return UnimplementedError(
        "kda cuda: the tensor-core backward needs bf16 q/k/v/beta and K, V in {64, 128}; got " +
        std::string(DTypeName(p.dtype)) + " K = " + std::to_string(p.key_dim) +
        " V = " + std::to_string(p.value_dim));
  }
  if (in.g.dtype() == DType::kF32) {
    return DispatchBackwardTc<float>(p, in, d_o, kept, d_final_state, tuning, grads, fused);
  }
  return DispatchBackwardTc<bf16>(p, in, d_o, kept, d_final_state, tuning, grads, fused);
}

}  // namespace orrery::kernels::cuda
