// Stable LatentMoE (spec §5): fp32-style sigmoid router with selection-only bias, renormalised
// top-k weights x routed scale, shared latent down-projection, SiTU-GLU experts, weighted latent
// sum, latent RMSNorm, up-projection, plus a full-width shared expert.
#include <cmath>

#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/situ.h"
#include "model/layers.h"

namespace orrery::model {

template <typename T>
MoeLayer<T>::MoeLayer(ParamStore& store, const ModelConfig& c, const std::string& prefix)
    : c_(&c),
      d_(c.hidden_size),
      e_(c.moe.num_experts),
      k_(c.moe.top_k),
      f_(c.moe.expert_intermediate),
      l_(c.expert_width()) {
  const double sd = 1.0 / std::sqrt(static_cast<double>(d_));
  router_ = store.Add<T>(prefix + ".router", {e_, d_}, Init::kNormal, sd, true);
  if (c.moe.latent_dim > 0) {
    down_ = store.Add<T>(prefix + ".down", {l_, d_}, Init::kNormal, sd, true);
  }
  const double sl = 1.0 / std::sqrt(static_cast<double>(l_));
  const double sf = 1.0 / std::sqrt(static_cast<double>(f_) * 2.0 * c.num_layers);
  for (int64_t e = 0; e < e_; ++e) {
    const std::string p = prefix + ".experts." + std::to_string(e);
    w1_.push_back(store.Add<T>(p + ".w1", {f_, l_}, Init::kNormal, sl, true));
    w3_.push_back(store.Add<T>(p + ".w3", {f_, l_}, Init::kNormal, sl, true));
    w2_.push_back(store.Add<T>(p + ".w2", {l_, f_}, Init::kNormal, sf, true));
  }
  if (c.moe.latent_norm)
    lnorm_ = store.Add<T>(prefix + ".latent_norm", {l_}, Init::kOnes, 0, false);
  if (c.moe.latent_dim > 0) {
    up_ = store.Add<T>(prefix + ".up", {d_, l_}, Init::kNormal,
                       1.0 / std::sqrt(static_cast<double>(l_) * 2.0 * c.num_layers), true);
  }
  if (c.moe.num_shared_experts > 0) {
    shared_ = GluMlp<T>(store, c, prefix + ".shared", d_, c.moe.shared_intermediate);
    has_shared_ = true;
  }
}

template <typename T>
Status MoeLayer<T>::Forward(const T* x, int64_t n, const int32_t* forced, const float* bias, T* y,
                            Cache* c) const {
  c->logits = Uninit<T>({n, e_});
  c->scores = Uninit<T>({n, e_});
  LinearForward(x, n, d_, router_, e_, Ptr<T>(c->logits));
  T* s = Ptr<T>(c->scores);
  for (int64_t i = 0; i < n * e_; ++i) s[i] = T(1) / (T(1) + std::exp(-Ptr<T>(c->logits)[i]));
  c->ids = Tensor::Zeros({n, k_}, DType::kI32);
  int32_t* ids = Ptr<int32_t>(c->ids);
  if (forced) {
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < k_; ++j) {
        const int32_t id = forced[t * k_ + j];
        if (id < 0 || id >= e_) {
          return InvalidArgumentError("forced_experts: expert id " + std::to_string(id) +
                                      " at token " + std::to_string(t) + " is outside [0, " +
                                      std::to_string(e_) + ")");
        }
        for (int64_t jj = 0; jj < j; ++jj) {
          if (ids[t * k_ + jj] == id) {
            return InvalidArgumentError("forced_experts: expert " + std::to_string(id) +
                                        " repeated at token " + std::to_string(t));
          }
        }
        ids[t * k_ + j] = id;
      }
    }
  } else {
    SelectTopK(s, bias, n, e_, k_, ids);
  }
  // Renormalised weights x routed scale (spec §5.1).
  c->weights = Uninit<T>({n, k_});
  T* w = Ptr<T>(c->weights);
  const T rho = static_cast<T>(c_->moe.routed_scaling_factor);
  for (int64_t t = 0; t < n; ++t) {
    T sum = 0;
    for (int64_t j = 0; j < k_; ++j) sum += s[t * e_ + ids[t * k_ + j]];
    for (int64_t j = 0; j < k_; ++j) {
      w[t * k_ + j] = rho * s[t * e_ + ids[t * k_ + j]] / (sum + static_cast<T>(1e-20));
    }
  }
  // Latent dispatch.
  const T* xl = x;
  if (c_->moe.latent_dim > 0) {
    c->xl = Uninit<T>({n, l_});
    LinearForward(x, n, d_, down_, l_, Ptr<T>(c->xl));
    xl = Ptr<T>(c->xl);
  }
  c->yl = NewTensor<T>({n, l_});
  T* yl = Ptr<T>(c->yl);
  c->rows.assign(static_cast<size_t>(e_), {});
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k_; ++j) c->rows[ids[t * k_ + j]].push_back(t * k_ + j);
  }
  c->xe.assign(e_, Tensor());
  c->a.assign(e_, Tensor());
  c->u.assign(e_, Tensor());
  c->h.assign(e_, Tensor());
  c->oe.assign(e_, Tensor());
  const kernels::GluActivation act = ActivationOf(*c_);
  for (int64_t e = 0; e < e_; ++e) {
    const auto& rows = c->rows[e];
    const int64_t m = static_cast<int64_t>(rows.size());
    if (m == 0) continue;
    c->xe[e] = Uninit<T>({m, l_});
    T* xe = Ptr<T>(c->xe[e]);
    for (int64_t r = 0; r < m; ++r) std::copy_n(xl + (rows[r] / k_) * l_, l_, xe + r * l_);
    c->a[e] = Uninit<T>({m, f_});
    c->u[e] = Uninit<T>({m, f_});
    c->h[e] = Uninit<T>({m, f_});
    c->oe[e] = Uninit<T>({m, l_});
    LinearForward(xe, m, l_, w1_[e], f_, Ptr<T>(c->a[e]));
    LinearForward(xe, m, l_, w3_[e], f_, Ptr<T>(c->u[e]));
    kernels::GluForward(act, Ptr<T>(c->a[e]), Ptr<T>(c->u[e]), m * f_, Ptr<T>(c->h[e]));
    LinearForward(Ptr<T>(c->h[e]), m, f_, w2_[e], l_, Ptr<T>(c->oe[e]));
    const T* oe = Ptr<T>(c->oe[e]);
    for (int64_t r = 0; r < m; ++r) {
      const T wr = w[rows[r]];
      T* dst = yl + (rows[r] / k_) * l_;
      for (int64_t i = 0; i < l_; ++i) dst[i] += wr * oe[r * l_ + i];
    }
  }
  const T* yn = yl;
  if (c_->moe.latent_norm) {
    c->yl_rstd = Uninit<T>({n});
    c->yln = Uninit<T>({n, l_});
    kernels::RmsNormForward(yl, lnorm_.w, n, l_, c_->rms_norm_eps, Ptr<T>(c->yln),
                            Ptr<T>(c->yl_rstd));
    yn = Ptr<T>(c->yln);
  }
  if (c_->moe.latent_dim > 0) {
    LinearForward(yn, n, l_, up_, d_, y);
  } else {
    std::copy_n(yn, n * d_, y);
  }
  if (has_shared_) {
    Tensor ys = Uninit<T>({n, d_});
    shared_.Forward(x, n, Ptr<T>(ys), &c->shared);
    for (int64_t i = 0; i < n * d_; ++i) y[i] += Ptr<T>(ys)[i];
  }
  return Status::OK();
}

template <typename T>
void MoeLayer<T>::Backward(const T* x, int64_t n, const Cache& c, const T* dy, T* dx) const {
  if (has_shared_) shared_.Backward(x, n, c.shared, dy, dx);
  Tensor dyn_t = NewTensor<T>({n, l_});
  T* dyn = Ptr<T>(dyn_t);
  if (c_->moe.latent_dim > 0) {
    LinearBackward(c_->moe.latent_norm ? Ptr<T>(c.yln) : Ptr<T>(c.yl), n, l_, up_, d_, dy, dyn);
  } else {
    std::copy_n(dy, n * d_, dyn);
  }
  Tensor dyl_t = Uninit<T>({n, l_});
  T* dyl = Ptr<T>(dyl_t);
  if (c_->moe.latent_norm) {
    kernels::RmsNormBackward(Ptr<T>(c.yl), lnorm_.w, Ptr<T>(c.yl_rstd), dyn, n, l_, dyl, lnorm_.g);
  } else {
    std::copy_n(dyn, n * l_, dyl);
  }
  const int32_t* ids = Ptr<int32_t>(c.ids);
  const T* w = Ptr<T>(c.weights);
  Tensor dw_t = NewTensor<T>({n, k_});
  T* dw = Ptr<T>(dw_t);
  Tensor dxl_t = NewTensor<T>({n, l_});
  T* dxl = Ptr<T>(dxl_t);
  const kernels::GluActivation act = ActivationOf(*c_);
  for (int64_t e = 0; e < e_; ++e) {
    const auto& rows = c.rows[e];
    const int64_t m = static_cast<int64_t>(rows.size());
    if (m == 0) continue;
    Tensor doe = Uninit<T>({m, l_});
    const T* oe = Ptr<T>(c.oe[e]);
    for (int64_t r = 0; r < m; ++r) {
      const T* g = dyl + (rows[r] / k_) * l_;
      T dot = 0;
      for (int64_t i = 0; i < l_; ++i) {
        Ptr<T>(doe)[r * l_ + i] = w[rows[r]] * g[i];
        dot += g[i] * oe[r * l_ + i];
      }
      dw[rows[r]] = dot;
    }
    Tensor dh = NewTensor<T>({m, f_}), da = Uninit<T>({m, f_}), du = Uninit<T>({m, f_});
    LinearBackward(Ptr<T>(c.h[e]), m, f_, w2_[e], l_, Ptr<T>(doe), Ptr<T>(dh));
    kernels::GluBackward(act, Ptr<T>(c.a[e]), Ptr<T>(c.u[e]), Ptr<T>(dh), m * f_, Ptr<T>(da),
                         Ptr<T>(du));
    Tensor dxe = NewTensor<T>({m, l_});
    LinearBackward(Ptr<T>(c.xe[e]), m, l_, w1_[e], f_, Ptr<T>(da), Ptr<T>(dxe));
    LinearBackward(Ptr<T>(c.xe[e]), m, l_, w3_[e], f_, Ptr<T>(du), Ptr<T>(dxe));
    for (int64_t r = 0; r < m; ++r) {
      T* dst = dxl + (rows[r] / k_) * l_;
      for (int64_t i = 0; i < l_; ++i) dst[i] += Ptr<T>(dxe)[r * l_ + i];
    }
  }
  if (c_->moe.latent_dim > 0) {
    LinearBackward(x, n, d_, down_, l_, dxl, dx);
  } else {
    for (int64_t i = 0; i < n * d_; ++i) dx[i] += dxl[i];
  }
  // Router: w_k = rho s_k / S over the selected; ds_k = (rho/S)(dw_k - sum_j (s_j/S) dw_j).
  const T* s = Ptr<T>(c.scores);
  const T rho = static_cast<T>(c_->moe.routed_scaling_factor);
  Tensor dlog_t = NewTensor<T>({n, e_});
  T* dlog = Ptr<T>(dlog_t);
  for (int64_t t = 0; t < n; ++t) {
    T sum = 0, mix = 0;
    for (int64_t j = 0; j < k_; ++j) sum += s[t * e_ + ids[t * k_ + j]];
    sum += static_cast<T>(1e-20);
    for (int64_t j = 0; j < k_; ++j) mix += s[t * e_ + ids[t * k_ + j]] / sum * dw[t * k_ + j];
    for (int64_t j = 0; j < k_; ++j) {
      const int64_t e = ids[t * k_ + j];
      const T ds = rho / sum * (dw[t * k_ + j] - mix);
      dlog[t * e_ + e] += ds * s[t * e_ + e] * (T(1) - s[t * e_ + e]);
    }
  }
  LinearBackward(x, n, d_, router_, e_, dlog, dx);
}

template class MoeLayer<float>;
template class MoeLayer<double>;

}  // namespace orrery::model
