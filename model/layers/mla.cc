// Gated MLA without positions (spec §3): optional q LoRA, latent kv with RMSNorm, per-head keys
// [k_nope | shared unrotated k_rope], causal softmax per document, output gate from the input.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/mla_attention.h"
#include "kernels/rmsnorm.h"
#include "model/layers.h"

namespace orrery::model {

template <typename T>
MlaLayer<T>::MlaLayer(ParamStore& store, const ModelConfig& c, const std::string& prefix)
    : c_(&c),
      d_(c.hidden_size),
      h_(c.mla.heads),
      ql_(c.mla.q_lora_rank),
      dc_(c.mla.kv_lora_rank),
      dn_(c.mla.qk_nope_head_dim),
      dr_(c.mla.qk_rope_head_dim),
      dv_(c.mla.v_head_dim),
      dqk_(c.mla_qk_head_dim()),
      scale_(1.0 / std::sqrt(static_cast<double>(c.mla_qk_head_dim()))) {
  const double sd = 1.0 / std::sqrt(static_cast<double>(d_));
  if (ql_ > 0) {
    wqa_ = store.Add<T>(prefix + ".wq_a", {ql_, d_}, Init::kNormal, sd, true);
    qnorm_ = store.Add<T>(prefix + ".q_a_norm", {ql_}, Init::kOnes, 0, false);
    wqb_ = store.Add<T>(prefix + ".wq_b", {h_ * dqk_, ql_}, Init::kNormal,
                        1.0 / std::sqrt(static_cast<double>(ql_)), true);
  } else {
    wq_ = store.Add<T>(prefix + ".wq", {h_ * dqk_, d_}, Init::kNormal, sd, true);
  }
  wkva_ = store.Add<T>(prefix + ".wkv_a", {dc_ + dr_, d_}, Init::kNormal, sd, true);
  kvnorm_ = store.Add<T>(prefix + ".kv_a_norm", {dc_}, Init::kOnes, 0, false);
  wkvb_ = store.Add<T>(prefix + ".wkv_b", {h_ * (dn_ + dv_), dc_}, Init::kNormal,
                       1.0 / std::sqrt(static_cast<double>(dc_)), true);
  if (c.mla.output_gate)
    wg_ = store.Add<T>(prefix + ".wg", {h_ * dv_, d_}, Init::kNormal, sd, true);
  wo_ = store.Add<T>(prefix + ".wo", {d_, h_ * dv_}, Init::kNormal,
                     1.0 / std::sqrt(static_cast<double>(h_ * dv_) * 2.0 * c.num_layers), true);
}

template <typename T>
void MlaLayer<T>::Queries(const T* x, int64_t n, Cache* c) const {
  c->q = NewTensor<T>({n, h_, dqk_});
  if (ql_ > 0) {
    c->qa = NewTensor<T>({n, ql_});
    c->qan = NewTensor<T>({n, ql_});
    c->qa_rstd = NewTensor<T>({n});
    LinearForward(x, n, d_, wqa_, ql_, Ptr<T>(c->qa));
    kernels::RmsNormForward(Ptr<T>(c->qa), qnorm_.w, n, ql_, c_->mla.lora_eps, Ptr<T>(c->qan),
                            Ptr<T>(c->qa_rstd));
    LinearForward(Ptr<T>(c->qan), n, ql_, wqb_, h_ * dqk_, Ptr<T>(c->q));
  } else {
    LinearForward(x, n, d_, wq_, h_ * dqk_, Ptr<T>(c->q));
  }
}

template <typename T>
void MlaLayer<T>::Output(const T* x, int64_t n, Cache* c, T* y) const {
  const T* attn = Ptr<T>(c->o);
  if (c_->mla.output_gate) {
    c->gate_logit = NewTensor<T>({n, h_ * dv_});
    c->og = NewTensor<T>({n, h_ * dv_});
    LinearForward(x, n, d_, wg_, h_ * dv_, Ptr<T>(c->gate_logit));
    for (int64_t i = 0; i < n * h_ * dv_; ++i) {
      Ptr<T>(c->og)[i] = attn[i] / (T(1) + std::exp(-Ptr<T>(c->gate_logit)[i]));
    }
    attn = Ptr<T>(c->og);
  }
  LinearForward(attn, n, h_ * dv_, wo_, d_, y);
}

template <typename T>
void MlaLayer<T>::Forward(const T* x, int64_t n, const std::vector<int64_t>& cu, T* y,
                          Cache* c) const {
  Queries(x, n, c);
  const int64_t w = dc_ + dr_;
  c->ckr = NewTensor<T>({n, w});
  LinearForward(x, n, d_, wkva_, w, Ptr<T>(c->ckr));
  Tensor cl = NewTensor<T>({n, dc_});
  for (int64_t t = 0; t < n; ++t) std::copy_n(Ptr<T>(c->ckr) + t * w, dc_, Ptr<T>(cl) + t * dc_);
  c->chat = NewTensor<T>({n, dc_});
  c->c_rstd = NewTensor<T>({n});
  kernels::RmsNormForward(Ptr<T>(cl), kvnorm_.w, n, dc_, c_->mla.lora_eps, Ptr<T>(c->chat),
                          Ptr<T>(c->c_rstd));
  c->kv = NewTensor<T>({n, h_, dn_ + dv_});
  LinearForward(Ptr<T>(c->chat), n, dc_, wkvb_, h_ * (dn_ + dv_), Ptr<T>(c->kv));
  c->k = NewTensor<T>({n, h_, dqk_});
  c->v = NewTensor<T>({n, h_, dv_});
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < h_; ++h) {
      const T* kv = Ptr<T>(c->kv) + (t * h_ + h) * (dn_ + dv_);
      T* k = Ptr<T>(c->k) + (t * h_ + h) * dqk_;
      std::copy_n(kv, dn_, k);
      std::copy_n(Ptr<T>(c->ckr) + t * w + dc_, dr_, k + dn_);
      std::copy_n(kv + dn_, dv_, Ptr<T>(c->v) + (t * h_ + h) * dv_);
    }
  }
  c->o = NewTensor<T>({n, h_, dv_});
  c->lse = NewTensor<T>({n, h_});
  const kernels::AttentionShape shape{n, h_, dqk_, dv_};
  kernels::CausalAttentionForward(shape, cu, scale_, Ptr<T>(c->q), Ptr<T>(c->k), Ptr<T>(c->v),
                                  Ptr<T>(c->o), Ptr<T>(c->lse));
  Output(x, n, c, y);
}

template <typename T>
void MlaLayer<T>::Infer(const T* x, int64_t n, const std::vector<int64_t>& cu,
                        const std::vector<T*>& caches, const std::vector<int64_t>& past,
                        T* y) const {
  Cache c;
  Queries(x, n, &c);
  // Latent rows of the new tokens: [c-hat (normalised) | k^R], written into each cache.
  const int64_t w = dc_ + dr_;
  Tensor ckr = NewTensor<T>({n, w}), cl = NewTensor<T>({n, dc_}), rstd = NewTensor<T>({n});
  LinearForward(x, n, d_, wkva_, w, Ptr<T>(ckr));
  for (int64_t t = 0; t < n; ++t) std::copy_n(Ptr<T>(ckr) + t * w, dc_, Ptr<T>(cl) + t * dc_);
  kernels::RmsNormForward(Ptr<T>(cl), kvnorm_.w, n, dc_, c_->mla.lora_eps, Ptr<T>(cl),
                          Ptr<T>(rstd));
  const size_t segments = cu.size() - 1;
  for (size_t s = 0; s < segments; ++s) {
    for (int64_t t = cu[s]; t < cu[s + 1]; ++t) {
      T* row = caches[s] + (past[s] + t - cu[s]) * w;
      std::copy_n(Ptr<T>(cl) + t * dc_, dc_, row);
      std::copy_n(Ptr<T>(ckr) + t * w + dc_, dr_, row + dc_);
    }
  }
  // Absorbed queries qa [n, H, dc + dr]: [W_UK,h^T q^N_h | q^R_h]; W_UK,h is rows
  // h*(dn+dv) .. h*(dn+dv)+dn of W_kvb [H*(dn+dv), dc], W_UV,h the next dv rows.
  Tensor qa = NewTensor<T>({n, h_, w});
  const T* q = Ptr<T>(c.q);
  for (int64_t h = 0; h < h_; ++h) {
    kernels::Gemm(false, false, n, dc_, dn_, T(1), q + h * dqk_, h_ * dqk_,
                  wkvb_.w + h * (dn_ + dv_) * dc_, dc_, T(0), Ptr<T>(qa) + h * w, h_ * w);
    for (int64_t t = 0; t < n; ++t) {
      std::copy_n(q + (t * h_ + h) * dqk_ + dn_, dr_, Ptr<T>(qa) + (t * h_ + h) * w + dc_);
    }
  }
  // Per segment: scores [m*H, L] over its cache (token i sees rows <= past + i), softmax, then the
  // latent output ol [m*H, dc] = P * c-hat.
  Tensor ol = NewTensor<T>({n, h_, dc_});
  ThreadPool::Default().ParallelFor(static_cast<int64_t>(segments), 1, [&](int64_t sb, int64_t se) {
    std::vector<T> scores;
    for (int64_t s = sb; s < se; ++s) {
      const int64_t m = cu[s + 1] - cu[s], len = past[s] + m, rows = m * h_;
      if (m == 0) continue;
      scores.assign(static_cast<size_t>(rows * len), T(0));
      kernels::Gemm(false, true, rows, len, w, static_cast<T>(scale_), Ptr<T>(qa) + cu[s] * h_ * w,
                    w, caches[s], w, T(0), scores.data(), len);
      for (int64_t r = 0; r < rows; ++r) {
        T* row = scores.data() + r * len;
        const int64_t visible = past[s] + r / h_ + 1;
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < visible; ++j) mx = std::max(mx, row[j]);
        T sum = 0;
        for (int64_t j = 0; j < visible; ++j) {
          row[j] = std::exp(row[j] - mx);
          sum += row[j];
        }
        for (int64_t j = 0; j < visible; ++j) row[j] /= sum;
        for (int64_t j = visible; j < len; ++j) row[j] = 0;
      }
      kernels::Gemm(false, false, rows, dc_, len, T(1), scores.data(), len, caches[s], w, T(0),
                    Ptr<T>(ol) + cu[s] * h_ * dc_, dc_);
    }
  });
  c.o = NewTensor<T>({n, h_, dv_});
  for (int64_t h = 0; h < h_; ++h) {
    kernels::Gemm(false, true, n, dv_, dc_, T(1), Ptr<T>(ol) + h * dc_, h_ * dc_,
                  wkvb_.w + (h * (dn_ + dv_) + dn_) * dc_, dc_, T(0), Ptr<T>(c.o) + h * dv_,
                  h_ * dv_);
  }
  Output(x, n, &c, y);
}

template <typename T>
void MlaLayer<T>::Backward(const T* x, int64_t n, const std::vector<int64_t>& cu, const Cache& c,
                           const T* dy, T* dx) const {
  const int64_t hv = h_ * dv_;
  Tensor dattn = NewTensor<T>({n, hv});
  LinearBackward(c_->mla.output_gate ? Ptr<T>(c.og) : Ptr<T>(c.o), n, hv, wo_, d_, dy,
                 Ptr<T>(dattn));
  Tensor d_o = NewTensor<T>({n, hv});
  if (c_->mla.output_gate) {
    Tensor dgl = NewTensor<T>({n, hv});
    for (int64_t i = 0; i < n * hv; ++i) {
      const T sg = T(1) / (T(1) + std::exp(-Ptr<T>(c.gate_logit)[i]));
      Ptr<T>(d_o)[i] = Ptr<T>(dattn)[i] * sg;
      Ptr<T>(dgl)[i] = Ptr<T>(dattn)[i] * Ptr<T>(c.o)[i] * sg * (T(1) - sg);
    }
    LinearBackward(x, n, d_, wg_, hv, Ptr<T>(dgl), dx);
  } else {
    d_o = dattn;
  }
  Tensor dq = NewTensor<T>({n, h_, dqk_}), dk = NewTensor<T>({n, h_, dqk_}),
         dv = NewTensor<T>({n, h_, dv_});
  const kernels::AttentionShape shape{n, h_, dqk_, dv_};
  kernels::CausalAttentionBackward(shape, cu, scale_, Ptr<T>(c.q), Ptr<T>(c.k), Ptr<T>(c.v),
                                   Ptr<T>(c.o), Ptr<T>(c.lse), Ptr<T>(d_o), Ptr<T>(dq), Ptr<T>(dk),
                                   Ptr<T>(dv));
  const int64_t w = dc_ + dr_;
  Tensor dkv = NewTensor<T>({n, h_, dn_ + dv_}), dckr = NewTensor<T>({n, w});
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < h_; ++h) {
      T* g = Ptr<T>(dkv) + (t * h_ + h) * (dn_ + dv_);
      const T* gk = Ptr<T>(dk) + (t * h_ + h) * dqk_;
      std::copy_n(gk, dn_, g);
      std::copy_n(Ptr<T>(dv) + (t * h_ + h) * dv_, dv_, g + dn_);
      T* gr = Ptr<T>(dckr) + t * w + dc_;
      for (int64_t i = 0; i < dr_; ++i) gr[i] += gk[dn_ + i];
    }
  }
  Tensor dchat = NewTensor<T>({n, dc_});
  LinearBackward(Ptr<T>(c.chat), n, dc_, wkvb_, h_ * (dn_ + dv_), Ptr<T>(dkv), Ptr<T>(dchat));
  Tensor cl = NewTensor<T>({n, dc_}), dcl = NewTensor<T>({n, dc_});
  for (int64_t t = 0; t < n; ++t) std::copy_n(Ptr<T>(c.ckr) + t * w, dc_, Ptr<T>(cl) + t * dc_);
  kernels::RmsNormBackward(Ptr<T>(cl), kvnorm_.w, Ptr<T>(c.c_rstd), Ptr<T>(dchat), n, dc_,
                           Ptr<T>(dcl), kvnorm_.g);
  for (int64_t t = 0; t < n; ++t) std::copy_n(Ptr<T>(dcl) + t * dc_, dc_, Ptr<T>(dckr) + t * w);
  LinearBackward(x, n, d_, wkva_, w, Ptr<T>(dckr), dx);
  if (ql_ > 0) {
    Tensor dqan = NewTensor<T>({n, ql_}), dqa = NewTensor<T>({n, ql_});
    LinearBackward(Ptr<T>(c.qan), n, ql_, wqb_, h_ * dqk_, Ptr<T>(dq), Ptr<T>(dqan));
    kernels::RmsNormBackward(Ptr<T>(c.qa), qnorm_.w, Ptr<T>(c.qa_rstd), Ptr<T>(dqan), n, ql_,
                             Ptr<T>(dqa), qnorm_.g);
    LinearBackward(x, n, d_, wqa_, ql_, Ptr<T>(dqa), dx);
  } else {
    LinearBackward(x, n, d_, wq_, h_ * dqk_, Ptr<T>(dq), dx);
  }
}

template class MlaLayer<float>;
template class MlaLayer<double>;

}  // namespace orrery::model
