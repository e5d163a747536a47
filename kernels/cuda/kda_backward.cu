// KDA chunked backward on the GPU (spec §2.4), 16-token chunks, fp32 arithmetic.
//
// Three kernels, the same maths as kernels/cpu/kda_chunked.cc (BackwardChunk), split so that only
// the state-gradient chain is sequential:
//   1. the forward sweep (kda_forward.cu) keeps the state S at every chunk start and the
//      pseudo-values Vnew;
//   2. the state pass, one block per (sequence, head, 32-wide V slice), walks the chunks in
//      reverse with its K x 32 slice of dS (the gradient of the chunk-end state) in shared memory:
//        dVnew = A_qk^T dO + Kbar dS                       (kept for pass 3)
//        dKbar = Vnew dS^T,  dGc = e^{Gc} sum_v S dS         (this V slice's part)
//        dS <- scale Qt^T dO + Diag(e^{Gc}) dS - W^T dVnew
//      and finally writes dS as dh0;
//   3. the chunk pass, one block per (chunk, head), all chunks at once, with the full V:
//        dQt = scale dO S^T,  dW = -dVnew S^T,  dA_qk = dO Vnew^T,
//        dTm = dW (beta Kt)^T + dVnew (beta V)^T,  dBk = Tm^T dW,  dBv = Tm^T dVnew,
//        dA_kk = -Tm^T dTm Tm^T, then the pairwise (exponent G_r - G_j <= 0) and element-wise
//        terms of dq, dk, dG, dbeta, and dg = reverse cumsum of dG plus the chunk-end terms.
// Each element of dq, dk, dG is owned by one thread (the pairwise sums run over the chunk's rows),
// so pass 3 needs no atomics; the V slices' parts of dKbar and dGc lie apart and pass 3 adds them
// in slice order. No float atomics anywhere: the same inputs give the same bits on every run. Like
// the forward, the pairwise form is exact for the bounded and the original gate. SIMT fp32: it
// serves f32 inputs and the shapes the tensor-core backward (kda_backward_tc.cu) does not take.
#include <cuda_bf16.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/kda_cuda.h"
#include "kernels/cuda/kda_cuda_util.cuh"

namespace orrery::kernels::cuda {
namespace {

constexpr int kChunk = 16;
constexpr int kSliceV = 32;
constexpr int kThreads = 256;

template <typename In, typename GIn>
struct BackwardParams {
  const In *q, *k, *v, *beta, *d_o;
  const GIn* g;
  const int64_t* seq_start;    // [N + 1] flattened token rows
  const int64_t* chunk_first;  // [N + 1] first global chunk of each sequence
  const int64_t* chunk_seq;    // [chunks] the sequence of each global chunk
  const float* chunk_states;   // [chunks, H, K, V] state at each chunk start
  const float* vnew;           // [rows, H, V]
  const float* dht;            // [N, H, K, V] or null
  float* dh0;                  // [N, H, K, V] or null
  float* dvnew;                // [rows, H, V]
  // Per V slice of the state pass, [slices, rows, H, K] and [slices, chunks, H, K]: each slice's
  // part, written once; pass 3 sums the slices in order.
  float* dkbar;
  float* dgc;
  int64_t dkbar_slice, dgc_slice;  // elements per slice
  int slices;
  In *dq, *dk, *dv, *dbeta;
  GIn* dg;
  int heads, kd, vd;
  float scale;
};

// The chunk quantities both passes recompute from q, k, g, beta (rows >= c are zero).
struct ChunkSmem {
  float *q, *k, *G, *qt, *kt, *kbar;  // [C][K]: q, k, cumsum G, q e^G, k e^G, k e^{Gc - G}
  float *aqk, *akk_raw, *tm;          // [C][C]: A_qk; sum_d k_r k_j e^{G_r - G_j}; (I + A_kk)^-1
  float *beta, *egc;                  // [C], [K]
};

// Loads chunk rows [row0, row0 + c) of head h and forms G, e^{Gc}, Qt, Kt, Kbar, A_qk, the raw
// A_kk products and Tm = (I + Diag(beta) A_kk_raw)^-1. Ends with __syncthreads().
template <typename In, typename GIn>
__device__ void PrepareChunk(const BackwardParams<In, GIn>& p, int64_t row0, int c, int h,
                             const ChunkSmem& s) {
  const int kd = p.kd, tid = threadIdx.x;
  for (int i = tid; i < kChunk * kd; i += kThreads) {
    const int r = i / kd, d = i % kd;
    const int64_t off = ((row0 + r) * p.heads + h) * kd + d;
    s.q[i] = r < c ? LoadF(p.q + off) : 0.0f;
    s.k[i] = r < c ? LoadF(p.k + off) : 0.0f;
    s.G[i] = r < c ? LoadF(p.g + off) : 0.0f;
  }
  if (tid < kChunk) s.beta[tid] = tid < c ? LoadF(p.beta + (row0 + tid) * p.heads + h) : 0.0f;
  __syncthreads();
  for (int d = tid; d < kd; d += kThreads) {
    float acc = 0.0f;
    for (int r = 0; r < c; ++r) {
      acc += s.G[r * kd + d];
      s.G[r * kd + d] = acc;
    }
    s.egc[d] = __expf(acc);
  }
  __syncthreads();
  for (int i = tid; i < kChunk * kChunk; i += kThreads) {
    const int r = i / kChunk, j = i % kChunk;
    float sq = 0.0f, sk = 0.0f;
    if (r < c && j <= r) {
      for (int d = 0; d < kd; ++d) {
        const float kk = s.k[j * kd + d] * __expf(s.G[r * kd + d] - s.G[j * kd + d]);
        sq += s.q[r * kd + d] * kk;
        sk += s.k[r * kd + d] * kk;
      }
    }
    s.aqk[i] = p.scale * sq;
    s.akk_raw[i] = j < r ? sk : 0.0f;
  }
  for (int i = tid; i < kChunk * kd; i += kThreads) {
    const int r = i / kd, d = i % kd;
    if (r < c) {
      const float e = __expf(s.G[i]);
      s.qt[i] = s.q[i] * e;
      s.kt[i] = s.k[i] * e;
      s.kbar[i] = s.k[i] * __expf(s.G[(c - 1) * kd + d] - s.G[i]);
    } else {
      s.qt[i] = s.kt[i] = s.kbar[i] = 0.0f;
    }
  }
  __syncthreads();
  if (tid < 32) {
    const int j = tid;
    for (int r = 0; r < kChunk; ++r) {
      if (j < kChunk) {
        float val = j == r ? 1.0f : 0.0f;
        if (j < r) {
          float acc = 0.0f;
          for (int i = j; i < r; ++i)
            acc += s.beta[r] * s.akk_raw[r * kChunk + i] * s.tm[i * kChunk + j];
          val = -acc;
        }
        s.tm[r * kChunk + j] = val;
      }
      __syncwarp();
    }
  }
  __syncthreads();
}

size_t StateSharedBytes(int kd) {
  const size_t floats = static_cast<size_t>(kd) * kSliceV + 7 * kChunk * kd + 3 * kChunk * kSliceV +
                        3 * kChunk * kChunk + kChunk + kd;
  return floats * sizeof(float);
}

// Pass 2: one block per (sequence, head, V slice), chunks in reverse.
template <typename In, typename GIn>
__global__ void __launch_bounds__(kThreads) KdaBackwardStateKernel(BackwardParams<In, GIn> p) {
  extern __shared__ float smem[];
  const int kd = p.kd, vd = p.vd, heads = p.heads, tid = threadIdx.x;
  const int n = blockIdx.x / heads, h = blockIdx.x % heads;
  const int v0 = blockIdx.y * kSliceV;
  const int bv = min(kSliceV, vd - v0);
  float* dS = smem;  // [kd][kSliceV]
  ChunkSmem s;
  s.q = dS + kd * kSliceV;
  s.k = s.q + kChunk * kd;
  s.G = s.k + kChunk * kd;
  s.qt = s.G + kChunk * kd;
  s.kt = s.qt + kChunk * kd;
  s.kbar = s.kt + kChunk * kd;
  float* ws = s.kbar + kChunk * kd;  // W [C][kd]
  float* dos = ws + kChunk * kd;     // dO slice [C][kSliceV]
  float* vns = dos + kChunk * kSliceV;
  float* dvn = vns + kChunk * kSliceV;
  s.aqk = dvn + kChunk * kSliceV;
  s.akk_raw = s.aqk + kChunk * kChunk;
  s.tm = s.akk_raw + kChunk * kChunk;
  s.beta = s.tm + kChunk * kChunk;
  s.egc = s.beta + kChunk;

  const int64_t bos = p.seq_start[n], len = p.seq_start[n + 1] - bos;
  const int64_t state_off = (static_cast<int64_t>(n) * heads + h) * kd * vd;
  for (int i = tid; i < kd * kSliceV; i += kThreads) {
    const int d = i / kSliceV, j = i % kSliceV;
    dS[i] = (p.dht != nullptr && j < bv) ? p.dht[state_off + d * vd + v0 + j] : 0.0f;
  }
  const int64_t chunks = (len + kChunk - 1) / kChunk;
  for (int64_t ci = chunks - 1; ci >= 0; --ci) {
    const int64_t t0 = ci * kChunk, row0 = bos + t0;
    const int c = len - t0 < kChunk ? static_cast<int>(len - t0) : kChunk;
    const int64_t gchunk = p.chunk_first[n] + ci;
    PrepareChunk(p, row0, c, h, s);
    // W = Tm Diag(beta) Kt; the dO and Vnew slices.
    for (int i = tid; i < kChunk * kd; i += kThreads) {
      const int r = i / kd, d = i % kd;
      float acc = 0.0f;
      for (int m = 0; m <= r && m < c; ++m) {
        acc += s.tm[r * kChunk + m] * s.beta[m] * s.kt[m * kd + d];
      }
      ws[i] = r < c ? acc : 0.0f;
    }
    for (int i = tid; i < kChunk * kSliceV; i += kThreads) {
      const int r = i / kSliceV, j = i % kSliceV;
      const bool ok = r < c && j < bv;
      const int64_t off = ((row0 + r) * heads + h) * vd + v0 + j;
      dos[i] = ok ? LoadF(p.d_o + off) : 0.0f;
      vns[i] = ok ? p.vnew[off] : 0.0f;
    }
    __syncthreads();
    // dVnew = A_qk^T dO + Kbar dS.
    for (int i = tid; i < kChunk * kSliceV; i += kThreads) {
      const int r = i / kSliceV, j = i % kSliceV;
      float acc = 0.0f;
      if (r < c && j < bv) {
        for (int m = r; m < c; ++m) acc += s.aqk[m * kChunk + r] * dos[m * kSliceV + j];
        for (int d = 0; d < kd; ++d) acc += s.kbar[r * kd + d] * dS[d * kSliceV + j];
        p.dvnew[((row0 + r) * heads + h) * vd + v0 + j] = acc;
      }
      dvn[i] = acc;
    }
    // dKbar += Vnew dS^T and dGc += e^{Gc} sum_v S dS over this slice.
    for (int i = tid; i < c * kd; i += kThreads) {
      const int r = i / kd, d = i % kd;
      float acc = 0.0f;
      for (int j = 0; j < bv; ++j) acc += vns[r * kSliceV + j] * dS[d * kSliceV + j];
      p.dkbar[blockIdx.y * p.dkbar_slice + ((row0 + r) * heads + h) * kd + d] = acc;
    }
    {
      const float* S = p.chunk_states + (gchunk * heads + h) * kd * vd;
      for (int d = tid; d < kd; d += kThreads) {
        float acc = 0.0f;
        for (int j = 0; j < bv; ++j) acc += S[d * vd + v0 + j] * dS[d * kSliceV + j];
        p.dgc[blockIdx.y * p.dgc_slice + (gchunk * heads + h) * kd + d] = s.egc[d] * acc;
      }
    }
    __syncthreads();
    // dS <- scale Qt^T dO + Diag(e^{Gc}) dS - W^T dVnew.
    for (int i = tid; i < kd * kSliceV; i += kThreads) {
      const int d = i / kSliceV, j = i % kSliceV;
      float a = 0.0f, b = 0.0f;
      for (int r = 0; r < c; ++r) {
        a += s.qt[r * kd + d] * dos[r * kSliceV + j];
        b += ws[r * kd + d] * dvn[r * kSliceV + j];
      }
      dS[i] = p.scale * a + s.egc[d] * dS[i] - b;
    }
    __syncthreads();
  }
  if (p.dh0 != nullptr) {
    for (int i = tid; i < kd * kSliceV; i += kThreads) {
      const int d = i / kSliceV, j = i % kSliceV;
      if (j < bv) p.dh0[state_off + d * vd + v0 + j] = dS[i];
    }
  }
}

size_t ChunkSharedBytes(int kd, int vd) {
  const size_t floats = 10 * static_cast<size_t>(kChunk) * kd + 5 * kChunk * vd +
                        7 * kChunk * kChunk + 2 * kChunk + kd;
  return floats * sizeof(float);
}

// Pass 3: one block per (global chunk, head), every chunk at once.
template <typename In, typename GIn>
__global__ void __launch_bounds__(kThreads) KdaBackwardChunkKernel(BackwardParams<In, GIn> p) {
  extern __shared__ float smem[];
  const int kd = p.kd, vd = p.vd, heads = p.heads, tid = threadIdx.x;
  const int64_t gchunk = blockIdx.x;
  const int h = blockIdx.y;
  const int64_t n = p.chunk_seq[gchunk];
  const int64_t t0 = (gchunk - p.chunk_first[n]) * kChunk;
  const int64_t row0 = p.seq_start[n] + t0;
  const int64_t left = p.seq_start[n + 1] - row0;
  const int c = left < kChunk ? static_cast<int>(left) : kChunk;
  ChunkSmem s;
  s.q = smem;
  s.k = s.q + kChunk * kd;
  s.G = s.k + kChunk * kd;
  s.qt = s.G + kChunk * kd;
  s.kt = s.qt + kChunk * kd;
  s.kbar = s.kt + kChunk * kd;
  float* dqt = s.kbar + kChunk * kd;  // [C][kd]
  float* dw = dqt + kChunk * kd;      // dW, then dG
  float* dbk = dw + kChunk * kd;
  float* dkb = dbk + kChunk * kd;  // dKbar
  float* vs = dkb + kChunk * kd;   // [C][vd]
  float* vn = vs + kChunk * vd;
  float* dvn = vn + kChunk * vd;
  float* dos = dvn + kChunk * vd;
  float* dbv = dos + kChunk * vd;
  s.aqk = dbv + kChunk * vd;
  s.akk_raw = s.aqk + kChunk * kChunk;
  s.tm = s.akk_raw + kChunk * kChunk;
  float* daqk = s.tm + kChunk * kChunk;
  float* dtm = daqk + kChunk * kChunk;
  float* tmp = dtm + kChunk * kChunk;
  float* dakk = tmp + kChunk * kChunk;
  s.beta = dakk + kChunk * kChunk;
  float* dbeta = s.beta + kChunk;
  s.egc = dbeta + kChunk;

  PrepareChunk(p, row0, c, h, s);
  for (int i = tid; i < kChunk * vd; i += kThreads) {
    const int r = i / vd;
    const int64_t off = (row0 + r) * heads * vd + static_cast<int64_t>(h) * vd + i % vd;
    const bool ok = r < c;
    vs[i] = ok ? LoadF(p.v + off) : 0.0f;
    vn[i] = ok ? p.vnew[off] : 0.0f;
    dvn[i] = ok ? p.dvnew[off] : 0.0f;
    dos[i] = ok ? LoadF(p.d_o + off) : 0.0f;
  }
  for (int i = tid; i < kChunk * kd; i += kThreads) {
    const int r = i / kd;
    float sum = 0.0f;
    if (r < c) {
      const float* part = p.dkbar + ((row0 + r) * heads + h) * kd + i % kd;
      for (int sl = 0; sl < p.slices; ++sl) sum += part[sl * p.dkbar_slice];
    }
    dkb[i] = sum;
  }
  __syncthreads();
  // dQt = scale dO S^T, dW = -dVnew S^T (S from the forward sweep, read through L1/L2).
  {
    const float* S = p.chunk_states + (gchunk * heads + h) * kd * vd;
    for (int i = tid; i < kChunk * kd; i += kThreads) {
      const int r = i / kd, d = i % kd;
      float a = 0.0f, b = 0.0f;
      if (r < c) {
        for (int j = 0; j < vd; ++j) {
          const float sv = S[d * vd + j];
          a += dos[r * vd + j] * sv;
          b += dvn[r * vd + j] * sv;
        }
      }
      dqt[i] = p.scale * a;
      dw[i] = -b;
    }
  }
  // dA_qk = dO Vnew^T (j <= r).
  for (int i = tid; i < kChunk * kChunk; i += kThreads) {
    const int r = i / kChunk, j = i % kChunk;
    float acc = 0.0f;
    if (r < c && j <= r) {
      for (int x = 0; x < vd; ++x) acc += dos[r * vd + x] * vn[j * vd + x];
    }
    daqk[i] = acc;
  }
  __syncthreads();
  // dTm = dW (beta Kt)^T + dVnew (beta V)^T; dBk = Tm^T dW; dBv = Tm^T dVnew.
  for (int i = tid; i < kChunk * kChunk; i += kThreads) {
    const int r = i / kChunk, m = i % kChunk;
    float a = 0.0f, b = 0.0f;
    if (r < c && m < c) {
      for (int d = 0; d < kd; ++d) a += dw[r * kd + d] * s.kt[m * kd + d];
      for (int x = 0; x < vd; ++x) b += dvn[r * vd + x] * vs[m * vd + x];
    }
    dtm[i] = s.beta[m] * (a + b);
  }
  for (int i = tid; i < kChunk * kd; i += kThreads) {
    const int r = i / kd, d = i % kd;
    float acc = 0.0f;
    for (int m = r; m < c; ++m) acc += s.tm[m * kChunk + r] * dw[m * kd + d];
    dbk[i] = acc;
  }
  for (int i = tid; i < kChunk * vd; i += kThreads) {
    const int r = i / vd, x = i % vd;
    float acc = 0.0f;
    for (int m = r; m < c; ++m) acc += s.tm[m * kChunk + r] * dvn[m * vd + x];
    dbv[i] = acc;
    if (r < c) {
      StoreF(p.dv + ((row0 + r) * heads + h) * vd + x, s.beta[r] * acc);
    }
  }
  __syncthreads();
  // tmp = Tm^T dTm; dbeta from dBv . V and dBk . Kt (one warp per row).
  for (int i = tid; i < kChunk * kChunk; i += kThreads) {
    const int r = i / kChunk, m = i % kChunk;
    float acc = 0.0f;
    for (int x = r; x < c; ++x) acc += s.tm[x * kChunk + r] * dtm[x * kChunk + m];
    tmp[i] = acc;
  }
  {
    const int warp = tid / 32, lane = tid % 32;
    for (int r = warp; r < kChunk; r += kThreads / 32) {
      float acc = 0.0f;
      for (int x = lane; x < vd; x += 32) acc += dbv[r * vd + x] * vs[r * vd + x];
      for (int d = lane; d < kd; d += 32) acc += dbk[r * kd + d] * s.kt[r * kd + d];
      for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
      if (lane == 0) dbeta[r] = acc;
    }
  }
  __syncthreads();
  // dA_kk = -tmp Tm^T (only j < r is used).
  for (int i = tid; i < kChunk * kChunk; i += kThreads) {
    const int r = i / kChunk, j = i % kChunk;
    float acc = 0.0f;
    for (int x = 0; x <= j; ++x) acc += tmp[r * kChunk + x] * s.tm[j * kChunk + x];
    dakk[i] = -acc;
  }
  __syncthreads();
  // dbeta += sum_{j<r} dA_kk[r,j] * A_kk_raw[r,j].
  if (tid < kChunk) {
    const int r = tid;
    float acc = dbeta[r];
    for (int j = 0; j < r; ++j) acc += dakk[r * kChunk + j] * s.akk_raw[r * kChunk + j];
    if (r < c) StoreF(p.dbeta + (row0 + r) * heads + h, acc);
  }
  // Pairwise and element-wise terms; each thread owns element (i, d) of dq, dk and dG.
  for (int e = tid; e < c * kd; e += kThreads) {
    const int i = e / kd, d = e % kd;
    const float gi = s.G[e], ki = s.k[e], qi = s.q[e];
    float dq = 0.0f, dk = 0.0f, dG = 0.0f;
    for (int j = 0; j <= i; ++j) {
      const float kje = s.k[j * kd + d] * __expf(gi - s.G[j * kd + d]);
      const float aq = p.scale * daqk[i * kChunk + j];
      const float ak = j < i ? s.beta[i] * dakk[i * kChunk + j] : 0.0f;
      dq += aq * kje;
      dk += ak * kje;
      dG += (aq * qi + ak * ki) * kje;
    }
    for (int r = i; r < c; ++r) {
      const float ex = __expf(s.G[r * kd + d] - gi);
      const float aq = p.scale * daqk[r * kChunk + i];
      const float ak = i < r ? s.beta[r] * dakk[r * kChunk + i] : 0.0f;
      const float t = (aq * s.q[r * kd + d] + ak * s.k[r * kd + d]) * ex;
      dk += t;
      dG -= t * ki;
    }
    const float eg = __expf(gi);
    const float dkt = s.beta[i] * dbk[e];
    dq += dqt[e] * eg;
    dk += dkt * eg + dkb[e] * __expf(s.G[(c - 1) * kd + d] - gi);
    dG += dqt[e] * s.qt[e] + dkt * s.kt[e] - dkb[e] * s.kbar[e];
    const int64_t off = ((row0 + i) * heads + h) * kd + d;
    StoreF(p.dq + off, dq);
    StoreF(p.dk + off, dk);
    dw[e] = dG;  // dW is no longer needed
  }
  __syncthreads();
  // dg = reverse cumsum of dG, starting from the chunk-end terms dGc.
  for (int d = tid; d < kd; d += kThreads) {
    float acc = 0.0f;
    for (int sl = 0; sl < p.slices; ++sl)
      acc += p.dgc[sl * p.dgc_slice + (gchunk * heads + h) * kd + d];
    for (int r = 0; r < c; ++r) acc += dkb[r * kd + d] * s.kbar[r * kd + d];
    for (int r = c - 1; r >= 0; --r) {
      acc += dw[r * kd + d];
      StoreF(p.dg + ((row0 + r) * heads + h) * kd + d, acc);
    }
  }
}

template <typename In, typename GIn>
Status Launch(const KdaProblem& p, const KdaInputs& in, const Tensor& d_o,
              const Tensor& d_final_state, const int64_t* dev_index, int64_t total_chunks,
              float* chunk_states, float* vnew, float* dvnew, float* dkbar, float* dgc,
              KdaGrads* grads) {
  const int64_t nseq = p.num_sequences();
  BackwardParams<In, GIn> params;
  params.q = static_cast<const In*>(in.q.raw_data());
  params.k = static_cast<const In*>(in.k.raw_data());
  params.v = static_cast<const In*>(in.v.raw_data());
  params.beta = static_cast<const In*>(in.beta.raw_data());
  params.d_o = static_cast<const In*>(d_o.raw_data());
  params.g = static_cast<const GIn*>(in.g.raw_data());
  params.seq_start = dev_index;
  params.chunk_first = dev_index + nseq + 1;
  params.chunk_seq = dev_index + 2 * (nseq + 1);
  params.chunk_states = chunk_states;
  params.vnew = vnew;
  params.dht = d_final_state.defined() ? d_final_state.data<float>() : nullptr;
  params.dh0 = grads->dinitial_state.defined() ? grads->dinitial_state.data<float>() : nullptr;
  params.dvnew = dvnew;
  params.dkbar = dkbar;
  params.dgc = dgc;
  params.slices = static_cast<int>((p.value_dim + kSliceV - 1) / kSliceV);
  params.dkbar_slice = p.batch * p.tokens * p.heads * p.key_dim;
  params.dgc_slice = std::max<int64_t>(total_chunks, 1) * p.heads * p.key_dim;
  params.dq = static_cast<In*>(grads->dq.raw_data());
  params.dk = static_cast<In*>(grads->dk.raw_data());
  params.dv = static_cast<In*>(grads->dv.raw_data());
  params.dbeta = static_cast<In*>(grads->dbeta.raw_data());
  params.dg = static_cast<GIn*>(grads->dg.raw_data());
  params.heads = static_cast<int>(p.heads);
  params.kd = static_cast<int>(p.key_dim);
  params.vd = static_cast<int>(p.value_dim);
  params.scale = p.scale;

  const size_t state_smem = StateSharedBytes(params.kd);
  ORRERY_RETURN_IF_ERROR(CudaCheck(cudaFuncSetAttribute(KdaBackwardStateKernel<In, GIn>,
                                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                        static_cast<int>(state_smem)),
                                   "cudaFuncSetAttribute (state pass)"));
  const dim3 state_grid(static_cast<unsigned>(nseq * p.heads),
                        static_cast<unsigned>((p.value_dim + kSliceV - 1) / kSliceV));
  KdaBackwardStateKernel<In, GIn><<<state_grid, kThreads, state_smem>>>(params);
  ORRERY_RETURN_IF_ERROR(CudaCheck(cudaGetLastError(), "backward state pass launch"));
  if (total_chunks == 0) return Status::OK();
  const size_t chunk_smem = ChunkSharedBytes(params.kd, params.vd);
  ORRERY_RETURN_IF_ERROR(CudaCheck(cudaFuncSetAttribute(KdaBackwardChunkKernel<In, GIn>,
                                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                        static_cast<int>(chunk_smem)),
                                   "cudaFuncSetAttribute (chunk pass)"));
  const dim3 chunk_grid(static_cast<unsigned>(total_chunks), static_cast<unsigned>(p.heads));
  KdaBackwardChunkKernel<In, GIn><<<chunk_grid, kThreads, chunk_smem>>>(params);
  return CudaCheck(cudaGetLastError(), "backward chunk pass launch");
}

}  // namespace

Status KdaBackwardCuda(const KdaProblem& p, const KdaInputs& in, const Tensor& d_o,
                       const Tensor& d_final_state, KdaGrads* grads, const KdaTcSaved* kept,
                       const KdaInputTransforms* fused) {
  ORRERY_RETURN_IF_ERROR(CheckCudaKdaSupported(p, in));
  if (KdaTcSupported(p, in)) {
    return LaunchKdaBackwardTc(p, in, d_o, d_final_state, KdaTcTuning(), grads, kept, fused);
  }
  if (fused != nullptr) {
    return InternalError("kda cuda: input transforms fused into a backward without tensor cores");
  }
  const int64_t nseq = p.num_sequences(), heads = p.heads, kd = p.key_dim, vd = p.value_dim;
  const int64_t rows = p.batch * p.tokens;
  if (p.value_dim > 128) {
    return UnimplementedError("kda cuda backward: V = " + std::to_string(vd) +
                              ", the CUDA backward supports V <= 128 (a chunk's V rows live in "
                              "shared memory)");
  }
  // Host index: seq_start [N + 1], chunk_first [N + 1], chunk_seq [chunks], one device copy.
  std::vector<int64_t> index(p.seq_start);
  std::vector<int64_t> chunk_first(nseq + 1, 0), chunk_seq;
  for (int64_t n = 0; n < nseq; ++n) {
    const int64_t len = p.seq_start[n + 1] - p.seq_start[n];
    chunk_first[n + 1] = chunk_first[n] + (len + kChunk - 1) / kChunk;
    for (int64_t i = chunk_first[n]; i < chunk_first[n + 1]; ++i) chunk_seq.push_back(n);
  }
  const int64_t total_chunks = chunk_first[nseq];
  index.insert(index.end(), chunk_first.begin(), chunk_first.end());
  index.insert(index.end(), chunk_seq.begin(), chunk_seq.end());
  Tensor host_index = Tensor::FromVector<int64_t>({static_cast<int64_t>(index.size())}, index);
  ORRERY_ASSIGN_OR_RETURN(Tensor dev_index, host_index.To(p.device));

  grads->dinitial_state = Tensor();
  ORRERY_ASSIGN_OR_RETURN(grads->dq, Tensor::Allocate(in.q.shape(), in.q.dtype(), p.device));
  ORRERY_ASSIGN_OR_RETURN(grads->dk, Tensor::Allocate(in.k.shape(), in.k.dtype(), p.device));
  ORRERY_ASSIGN_OR_RETURN(grads->dv, Tensor::Allocate(in.v.shape(), in.v.dtype(), p.device));
  ORRERY_ASSIGN_OR_RETURN(grads->dg, Tensor::Allocate(in.g.shape(), in.g.dtype(), p.device));
  ORRERY_ASSIGN_OR_RETURN(grads->dbeta,
                          Tensor::Allocate(in.beta.shape(), in.beta.dtype(), p.device));
  if (in.initial_state.defined()) {
    ORRERY_ASSIGN_OR_RETURN(grads->dinitial_state,
                            Tensor::Allocate(in.initial_state.shape(), DType::kF32, p.device));
  }
  // Work space: chunk-start states, Vnew, dVnew, and the state pass's partial sums over V.
  ORRERY_ASSIGN_OR_RETURN(
      Tensor chunk_states,
      Tensor::Allocate({std::max<int64_t>(total_chunks, 1), heads, kd, vd}, DType::kF32, p.device));
  ORRERY_ASSIGN_OR_RETURN(Tensor vnew, Tensor::Allocate({rows, heads, vd}, DType::kF32, p.device));
  ORRERY_ASSIGN_OR_RETURN(Tensor dvnew, Tensor::Allocate({rows, heads, vd}, DType::kF32, p.device));
  // Every element a state pass block owns is written (rows of its chunks, every column).
  const int64_t slices = (vd + kSliceV - 1) / kSliceV;
  ORRERY_ASSIGN_OR_RETURN(Tensor dkbar,
                          Tensor::Allocate({slices, rows, heads, kd}, DType::kF32, p.device));
  ORRERY_ASSIGN_OR_RETURN(Tensor dgc,
                          Tensor::Allocate({slices, std::max<int64_t>(total_chunks, 1), heads, kd},
                                           DType::kF32, p.device));

  const int64_t* seq_start = dev_index.data<int64_t>();
  KdaForwardSweep sweep;
  sweep.chunk_first = seq_start + nseq + 1;
  sweep.chunk_states = chunk_states.data<float>();
  sweep.vnew = vnew.data<float>();
  KdaOutputs none;
  ORRERY_RETURN_IF_ERROR(LaunchKdaForward(p, in, seq_start, &none, sweep));
  float* cs = chunk_states.data<float>();
  float* vn = vnew.data<float>();
  float* dvn = dvnew.data<float>();
  float* dkb = dkbar.data<float>();
  float* dg = dgc.data<float>();
  if (p.dtype == DType::kBF16 && in.g.dtype() == DType::kF32) {
    ORRERY_RETURN_IF_ERROR((Launch<__nv_bfloat16, float>(
        p, in, d_o, d_final_state, seq_start, total_chunks, cs, vn, dvn, dkb, dg, grads)));
  } else if (p.dtype == DType::kBF16) {
    ORRERY_RETURN_IF_ERROR((Launch<__nv_bfloat16, __nv_bfloat16>(
        p, in, d_o, d_final_state, seq_start, total_chunks, cs, vn, dvn, dkb, dg, grads)));
  } else {
    ORRERY_RETURN_IF_ERROR((Launch<float, float>(p, in, d_o, d_final_state, seq_start, total_chunks,
                                                 cs, vn, dvn, dkb, dg, grads)));
  }
  // The work space is freed when this returns; wait for the kernels that read it.
  return CudaCheck(cudaDeviceSynchronize(), "backward kernels");
}

}  // namespace orrery::kernels::cuda
