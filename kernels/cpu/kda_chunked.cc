// The chunked WY/UT form of KDA (spec §2.4), forward and backward, on the CPU.
//
// Per chunk of c <= C tokens, with G the chunk-local inclusive cumsum of g and S the state at the
// chunk start:
//   A_kk[r,j] = beta_r sum_d k_rd k_jd e^{G_rd - G_jd}   (j < r)
//   A_qk[r,j] = scale sum_d q_rd k_jd e^{G_rd - G_jd}    (j <= r)
//   Tm = (I + A_kk)^-1,  W = Tm Diag(beta) (K e^G),  U = Tm Diag(beta) V
//   Vnew = U - W S,  O = scale (Q e^G) S + A_qk Vnew,  S' = Diag(e^{G_c}) S + (K e^{G_c - G})^T
//   Vnew
// The pairwise products are formed with e^{G_r - G_j} (exponent <= 0), so the reference is exact
// for the bounded and the unbounded (original) gate alike; the dense products go through
// kernels/gemm.h. The backward keeps every chunk's quantities and chunk-start state from a first
// forward sweep over a (sequence, head), then walks the chunks in reverse.
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/kda_cpu.h"
#include "kernels/cpu/kda_state_io.h"
#include "kernels/gemm.h"

namespace orrery::kernels::cpu {
namespace {

// Everything one chunk computes, kept for its backward. Row-major, c rows.
template <typename T>
struct Chunk {
  int64_t c = 0, kd = 0, vd = 0;
  std::vector<T> q, k, v, g, beta;      // inputs, gathered contiguously
  std::vector<T> G, qt, kt, kbar, egc;  // cumsum, Q e^G, K e^G, K e^{Gc-G}, e^{Gc} [K]
  std::vector<T> akk, aqk, tm;          // [c, c]
  std::vector<T> bk, bv, w, u, vnew;    // beta K e^G, beta V, W, U, Vnew

  void Resize(int64_t rows, int64_t kdim, int64_t vdim) {
    c = rows;
    kd = kdim;
    vd = vdim;
    for (auto* x : {&q, &k, &g, &G, &qt, &kt, &kbar, &bk, &w}) x->assign(c * kd, T(0));
    for (auto* x : {&v, &bv, &u, &vnew}) x->assign(c * vd, T(0));
    for (auto* x : {&akk, &aqk, &tm}) x->assign(c * c, T(0));
    beta.assign(c, T(0));
    egc.assign(kd, T(0));
  }
};

// Gathers rows [t0, t0 + c) of head h of the sequence starting at flattened row `bos`.
template <typename T>
void Gather(const KdaProblem& p, const KdaInputs& in, int64_t bos, int64_t h, int64_t t0,
            Chunk<T>& ch) {
  const int64_t kd = p.key_dim, vd = p.value_dim;
  for (int64_t r = 0; r < ch.c; ++r) {
    const int64_t row = bos + t0 + r;
    const int64_t qk = (row * p.heads + h) * kd, vo = (row * p.heads + h) * vd;
    std::copy_n(in.q.data<T>() + qk, kd, ch.q.data() + r * kd);
    std::copy_n(in.k.data<T>() + qk, kd, ch.k.data() + r * kd);
    std::copy_n(in.g.data<T>() + qk, kd, ch.g.data() + r * kd);
    std::copy_n(in.v.data<T>() + vo, vd, ch.v.data() + r * vd);
    ch.beta[r] = in.beta.data<T>()[row * p.heads + h];
  }
}

// Computes every chunk quantity except O and S' from the inputs and the chunk-start state s.
template <typename T>
void ComputeChunk(Chunk<T>& ch, const T* s, T scale) {
  const int64_t c = ch.c, kd = ch.kd, vd = ch.vd;
  for (int64_t d = 0; d < kd; ++d) {
    T acc = 0;
    for (int64_t r = 0; r < c; ++r) {
      acc += ch.g[r * kd + d];
      ch.G[r * kd + d] = acc;
    }
    ch.egc[d] = Exp(acc);
  }
  const T* gc = ch.G.data() + (c - 1) * kd;
  for (int64_t r = 0; r < c; ++r) {
    for (int64_t d = 0; d < kd; ++d) {
      const int64_t i = r * kd + d;
      const T e = Exp(ch.G[i]);
      ch.qt[i] = ch.q[i] * e;
      ch.kt[i] = ch.k[i] * e;
      ch.kbar[i] = ch.k[i] * Exp(gc[d] - ch.G[i]);
      ch.bk[i] = ch.beta[r] * ch.kt[i];
    }
    for (int64_t j = 0; j < vd; ++j) ch.bv[r * vd + j] = ch.beta[r] * ch.v[r * vd + j];
  }
  std::fill(ch.akk.begin(), ch.akk.end(), T(0));
  std::fill(ch.aqk.begin(), ch.aqk.end(), T(0));
  for (int64_t r = 0; r < c; ++r) {
    const T* qr = ch.q.data() + r * kd;
    const T* kr = ch.k.data() + r * kd;
    const T* gr = ch.G.data() + r * kd;
    for (int64_t j = 0; j <= r; ++j) {
      const T* kj = ch.k.data() + j * kd;
      const T* gj = ch.G.data() + j * kd;
      T sq = 0, sk = 0;
      for (int64_t d = 0; d < kd; ++d) {
        const T kk = kj[d] * Exp(gr[d] - gj[d]);
        sq += qr[d] * kk;
        sk += kr[d] * kk;
      }
      ch.aqk[r * c + j] = scale * sq;
      if (j < r) ch.akk[r * c + j] = ch.beta[r] * sk;
    }
  }
  // Tm = (I + A_kk)^-1 by forward substitution (unit lower triangular).
  std::fill(ch.tm.begin(), ch.tm.end(), T(0));
  for (int64_t r = 0; r < c; ++r) {
    ch.tm[r * c + r] = 1;
    for (int64_t j = 0; j < r; ++j) {
      T acc = 0;
      for (int64_t i = j; i < r; ++i) acc += ch.akk[r * c + i] * ch.tm[i * c + j];
      ch.tm[r * c + j] = -acc;
    }
  }
  Gemm<T>(false, false, c, kd, c, T(1), ch.tm.data(), ch.bk.data(), T(0), ch.w.data());
  Gemm<T>(false, false, c, vd, c, T(1), ch.tm.data(), ch.bv.data(), T(0), ch.u.data());
  ch.vnew = ch.u;
  Gemm<T>(false, false, c, vd, kd, T(-1), ch.w.data(), s, T(1), ch.vnew.data());
}

// o_chunk [c, V] = scale Qt S + A_qk Vnew; then s <- Diag(e^{Gc}) s + Kbar^T Vnew.
template <typename T>
void FinishChunk(const Chunk<T>& ch, T scale, T* s, T* o_chunk) {
  const int64_t c = ch.c, kd = ch.kd, vd = ch.vd;
  Gemm<T>(false, false, c, vd, kd, scale, ch.qt.data(), s, T(0), o_chunk);
  Gemm<T>(false, false, c, vd, c, T(1), ch.aqk.data(), ch.vnew.data(), T(1), o_chunk);
  for (int64_t d = 0; d < kd; ++d) {
    for (int64_t j = 0; j < vd; ++j) s[d * vd + j] *= ch.egc[d];
  }
  Gemm<T>(true, false, kd, vd, c, T(1), ch.kbar.data(), ch.vnew.data(), T(1), s);
}

template <typename T>
void Forward(const KdaProblem& p, const KdaInputs& in, Tensor* o, Tensor* final_state) {
  const int64_t kd = p.key_dim, vd = p.value_dim, heads = p.heads, cs = p.chunk_size;
  const T scale = static_cast<T>(p.scale);
  ThreadPool::Default().ParallelFor(p.num_sequences() * heads, 1, [&](int64_t b, int64_t e) {
    std::vector<T> s(kd * vd), oc(cs * vd);
    Chunk<T> ch;
    for (int64_t item = b; item < e; ++item) {
      const int64_t n = item / heads, h = item % heads;
      const int64_t bos = p.seq_start[n], len = p.seq_start[n + 1] - bos;
      LoadState(in.initial_state, n, h, p, s.data());
      for (int64_t t0 = 0; t0 < len; t0 += cs) {
        ch.Resize(std::min(cs, len - t0), kd, vd);
        Gather(p, in, bos, h, t0, ch);
        ComputeChunk(ch, s.data(), scale);
        FinishChunk(ch, scale, s.data(), oc.data());
        for (int64_t r = 0; r < ch.c; ++r) {
          std::copy_n(oc.data() + r * vd, vd, o->data<T>() + ((bos + t0 + r) * heads + h) * vd);
        }
      }
      if (final_state->defined()) StoreState(s.data(), n, h, p, *final_state);
    }
  });
}

// Gradients of one chunk. ds: in, the gradient of the chunk-end state; out, of the chunk-start
// state s. d_o [c, V] is this chunk's output gradient. Writes dq, dk, dg (of g, after the reverse
// cumsum) [c, K], dv [c, V] and dbeta [c].
template <typename T>
struct ChunkGrads {
  std::vector<T> dq, dk, dv, dg, dbeta;
  std::vector<T> dqt, dkt, dkbar, dG, dgc, daqk, dakk, dvnew, dw, dtm, dbk, dbv, tmp, ds_next;
};

template <typename T>
void BackwardChunk(const Chunk<T>& ch, const T* s, const T* d_o, T scale, T* ds,
                   ChunkGrads<T>& gr) {
  const int64_t c = ch.c, kd = ch.kd, vd = ch.vd;
  for (auto* x : {&gr.dq, &gr.dk, &gr.dG, &gr.dqt, &gr.dkt, &gr.dkbar, &gr.dw, &gr.dbk}) {
    x->assign(c * kd, T(0));
  }
  for (auto* x : {&gr.dv, &gr.dvnew, &gr.dbv}) x->assign(c * vd, T(0));
  for (auto* x : {&gr.daqk, &gr.dakk, &gr.dtm, &gr.tmp}) x->assign(c * c, T(0));
  gr.dbeta.assign(c, T(0));
  gr.dgc.assign(kd, T(0));
  gr.ds_next.assign(ds, ds + kd * vd);
  const T* dsn = gr.ds_next.data();

  // O = scale Qt S + A_qk Vnew.
  Gemm<T>(false, true, c, kd, vd, scale, d_o, s, T(0), gr.dqt.data());
  Gemm<T>(true, false, kd, vd, c, scale, ch.qt.data(), d_o, T(0), ds);
  Gemm<T>(false, true, c, c, vd, T(1), d_o, ch.vnew.data(), T(0), gr.daqk.data());
  Gemm<T>(true, false, c, vd, c, T(1), ch.aqk.data(), d_o, T(0), gr.dvnew.data());
  // S' = Diag(e^{Gc}) S + Kbar^T Vnew.
  for (int64_t d = 0; d < kd; ++d) {
    T acc = 0;
    for (int64_t j = 0; j < vd; ++j) {
      acc += s[d * vd + j] * dsn[d * vd + j];
      ds[d * vd + j] += ch.egc[d] * dsn[d * vd + j];
    }
    gr.dgc[d] += ch.egc[d] * acc;
  }
  Gemm<T>(false, false, c, vd, kd, T(1), ch.kbar.data(), dsn, T(1), gr.dvnew.data());
  Gemm<T>(false, true, c, kd, vd, T(1), ch.vnew.data(), dsn, T(0), gr.dkbar.data());
  // Vnew = U - W S.
  Gemm<T>(false, true, c, kd, vd, T(-1), gr.dvnew.data(), s, T(0), gr.dw.data());
  Gemm<T>(true, false, kd, vd, c, T(-1), ch.w.data(), gr.dvnew.data(), T(1), ds);
  // W = Tm Bk, U = Tm Bv (dU = dVnew).
  Gemm<T>(false, true, c, c, kd, T(1), gr.dw.data(), ch.bk.data(), T(0), gr.dtm.data());
  Gemm<T>(false, true, c, c, vd, T(1), gr.dvnew.data(), ch.bv.data(), T(1), gr.dtm.data());
  Gemm<T>(true, false, c, kd, c, T(1), ch.tm.data(), gr.dw.data(), T(0), gr.dbk.data());
  Gemm<T>(true, false, c, vd, c, T(1), ch.tm.data(), gr.dvnew.data(), T(0), gr.dbv.data());
  for (int64_t r = 0; r < c; ++r) {
    T db = 0;
    for (int64_t j = 0; j < vd; ++j) {
      db += gr.dbv[r * vd + j] * ch.v[r * vd + j];
      gr.dv[r * vd + j] = ch.beta[r] * gr.dbv[r * vd + j];
    }
    for (int64_t d = 0; d < kd; ++d) {
      db += gr.dbk[r * kd + d] * ch.kt[r * kd + d];
      gr.dkt[r * kd + d] = ch.beta[r] * gr.dbk[r * kd + d];
    }
    gr.dbeta[r] = db;
  }
  // Tm = (I + A_kk)^-1  =>  dA_kk = -Tm^T dTm Tm^T (strictly lower part is used).
  Gemm<T>(true, false, c, c, c, T(1), ch.tm.data(), gr.dtm.data(), T(0), gr.tmp.data());
  Gemm<T>(false, true, c, c, c, T(-1), gr.tmp.data(), ch.tm.data(), T(0), gr.dakk.data());
  // Pairwise terms of A_kk and A_qk.
  for (int64_t r = 0; r < c; ++r) {
    const T* qr = ch.q.data() + r * kd;
    const T* kr = ch.k.data() + r * kd;
    const T* gr_r = ch.G.data() + r * kd;
    for (int64_t j = 0; j <= r; ++j) {
      const T* kj = ch.k.data() + j * kd;
      const T* gj = ch.G.data() + j * kd;
      const T a_qk = scale * gr.daqk[r * c + j];
      const T a_kk = j < r ? ch.beta[r] * gr.dakk[r * c + j] : T(0);
      T pkk = 0;
      for (int64_t d = 0; d < kd; ++d) {
        const T e = Exp(gr_r[d] - gj[d]);
        const T kje = kj[d] * e;
        pkk += kr[d] * kje;
        gr.dq[r * kd + d] += a_qk * kje;
        gr.dk[r * kd + d] += a_kk * kje;
        gr.dk[j * kd + d] += (a_qk * qr[d] + a_kk * kr[d]) * e;
        const T dgv = (a_qk * qr[d] + a_kk * kr[d]) * kje;
        gr.dG[r * kd + d] += dgv;
        gr.dG[j * kd + d] -= dgv;
      }
      if (j < r) gr.dbeta[r] += gr.dakk[r * c + j] * pkk;
    }
  }
  // Element-wise: Qt = Q e^G, Kt = K e^G, Kbar = K e^{Gc - G}.
  const T* gc = ch.G.data() + (c - 1) * kd;
  for (int64_t r = 0; r < c; ++r) {
    for (int64_t d = 0; d < kd; ++d) {
      const int64_t i = r * kd + d;
      const T e = Exp(ch.G[i]);
      gr.dq[i] += gr.dqt[i] * e;
      gr.dk[i] += gr.dkt[i] * e + gr.dkbar[i] * Exp(gc[d] - ch.G[i]);
      const T kb = gr.dkbar[i] * ch.kbar[i];
      gr.dG[i] += gr.dqt[i] * ch.qt[i] + gr.dkt[i] * ch.kt[i] - kb;
      gr.dgc[d] += kb;
    }
  }
  // G = cumsum g: dg_i = sum_{r >= i} dG_r (the chunk-end terms land on the last row).
  gr.dg.assign(c * kd, T(0));
  for (int64_t d = 0; d < kd; ++d) {
    T acc = gr.dgc[d];
    for (int64_t r = c - 1; r >= 0; --r) {
      acc += gr.dG[r * kd + d];
      gr.dg[r * kd + d] = acc;
    }
  }
}

template <typename T>
void Backward(const KdaProblem& p, const KdaInputs& in, const Tensor& d_o,
              const Tensor& d_final_state, KdaGrads* grads) {
  const int64_t kd = p.key_dim, vd = p.value_dim, kv = kd * vd, heads = p.heads;
  const int64_t cs = p.chunk_size;
  const T scale = static_cast<T>(p.scale);
  ThreadPool::Default().ParallelFor(p.num_sequences() * heads, 1, [&](int64_t b, int64_t e) {
    std::vector<T> starts, ds(kv), oc(cs * vd), doc(cs * vd);
    std::vector<Chunk<T>> saved;  // every chunk of the current item, kept for the reverse pass
    ChunkGrads<T> gr;
    for (int64_t item = b; item < e; ++item) {
      const int64_t n = item / heads, h = item % heads;
      const int64_t bos = p.seq_start[n], len = p.seq_start[n + 1] - bos;
      const int64_t chunks = (len + cs - 1) / cs;
      // Forward sweep: the state at the start of every chunk, and every chunk's quantities.
      starts.assign((chunks + 1) * kv, T(0));
      if (static_cast<int64_t>(saved.size()) < chunks) saved.resize(chunks);
      LoadState(in.initial_state, n, h, p, starts.data());
      for (int64_t i = 0; i < chunks; ++i) {
        const int64_t t0 = i * cs;
        Chunk<T>& ch = saved[i];
        ch.Resize(std::min(cs, len - t0), kd, vd);
        Gather(p, in, bos, h, t0, ch);
        std::copy_n(starts.data() + i * kv, kv, starts.data() + (i + 1) * kv);
        ComputeChunk(ch, starts.data() + i * kv, scale);
        FinishChunk(ch, scale, starts.data() + (i + 1) * kv, oc.data());
      }
      LoadState(d_final_state, n, h, p, ds.data());
      for (int64_t i = chunks - 1; i >= 0; --i) {
        const int64_t t0 = i * cs;
        const Chunk<T>& ch = saved[i];
        for (int64_t r = 0; r < ch.c; ++r) {
          std::copy_n(d_o.data<T>() + ((bos + t0 + r) * heads + h) * vd, vd, doc.data() + r * vd);
        }
        BackwardChunk(ch, starts.data() + i * kv, doc.data(), scale, ds.data(), gr);
        for (int64_t r = 0; r < ch.c; ++r) {
          const int64_t row = bos + t0 + r;
          const int64_t qk = (row * heads + h) * kd, vo = (row * heads + h) * vd;
          std::copy_n(gr.dq.data() + r * kd, kd, grads->dq.data<T>() + qk);
          std::copy_n(gr.dk.data() + r * kd, kd, grads->dk.data<T>() + qk);
          std::copy_n(gr.dg.data() + r * kd, kd, grads->dg.data<T>() + qk);
          std::copy_n(gr.dv.data() + r * vd, vd, grads->dv.data<T>() + vo);
          grads->dbeta.data<T>()[row * heads + h] = gr.dbeta[r];
        }
      }
      if (grads->dinitial_state.defined()) StoreState(ds.data(), n, h, p, grads->dinitial_state);
    }
  });
}

}  // namespace

Status KdaChunkedForwardCpu(const KdaProblem& p, const KdaInputs& in, Tensor* o,
                            Tensor* final_state) {
  if (p.dtype == DType::kF64) {
    Forward<double>(p, in, o, final_state);
  } else {
    Forward<float>(p, in, o, final_state);
  }
  return Status::OK();
}

Status KdaChunkedBackwardCpu(const KdaProblem& p, const KdaInputs& in, const Tensor& d_o,
                             const Tensor& d_final_state, KdaGrads* grads) {
  if (p.dtype == DType::kF64) {
    Backward<double>(p, in, d_o, d_final_state, grads);
  } else {
    Backward<float>(p, in, d_o, d_final_state, grads);
  }
  return Status::OK();
}

}  // namespace orrery::kernels::cpu
