// The KDA layer (spec §2.1): q/k/v projections, short causal depthwise conv + SiLU per document,
// q/k L2 norm, low-rank decay logits, gate, beta sigmoid, the KDA core (kernels/kda.h), output
// RMSNorm (shared gain over V) times a sigmoid output gate, output projection.
#include "kernels/kda.h"

#include <cmath>

#include "kernels/cpu/fast_math.h"
#include "kernels/rmsnorm.h"
#include "kernels/short_conv.h"
#include "model/layers.h"
#include "model/layers/kda_core.h"

namespace orrery::model {
namespace {

using kernels::cpu::Sigmoid;

Tensor CuTensor(const std::vector<int64_t>& cu) {
  return Tensor::FromVector<int64_t>({static_cast<int64_t>(cu.size())}, cu);
}

}  // namespace

template <typename T>
KdaLayer<T>::KdaLayer(ParamStore& store, const ModelConfig& c, const std::string& prefix)
    : c_(&c),
      d_(c.hidden_size),
      h_(c.kda.heads),
      kd_(c.kda.head_k_dim),
      vd_(c.kda.head_v_dim),
      pk_(c.kda_key_width()),
      pv_(c.kda_value_width()),
      conv_(c.kda.conv_size),
      rank_(c.kda.decay_rank),
      grank_(c.kda.output_gate_rank) {
  const double sd = 1.0 / std::sqrt(static_cast<double>(d_));
  const double sc = 1.0 / std::sqrt(static_cast<double>(conv_));
  wq_ = store.Add<T>(prefix + ".wq", {pk_, d_}, Init::kNormal, sd, true);
  wk_ = store.Add<T>(prefix + ".wk", {pk_, d_}, Init::kNormal, sd, true);
  wv_ = store.Add<T>(prefix + ".wv", {pv_, d_}, Init::kNormal, sd, true);
  cq_ = store.Add<T>(prefix + ".conv_q", {pk_, conv_}, Init::kNormal, sc, true);
  ck_ = store.Add<T>(prefix + ".conv_k", {pk_, conv_}, Init::kNormal, sc, true);
  cv_ = store.Add<T>(prefix + ".conv_v", {pv_, conv_}, Init::kNormal, sc, true);
  fa_ = store.Add<T>(prefix + ".f_a", {rank_, d_}, Init::kNormal, sd, true);
  fb_ = store.Add<T>(prefix + ".f_b", {pk_, rank_}, Init::kNormal,
                     1.0 / std::sqrt(static_cast<double>(rank_)), true);
  a_log_ = store.Add<T>(prefix + ".A_log", {h_}, Init::kKdaALog, 0, false);
  dt_bias_ = store.Add<T>(prefix + ".dt_bias", {pk_}, Init::kKdaDtBias, 0, false);
  wb_ = store.Add<T>(prefix + ".w_beta", {h_, d_}, Init::kNormal, sd, true);
  onorm_ = store.Add<T>(prefix + ".o_norm", {vd_}, Init::kOnes, 0, false);
  if (grank_ > 0) {
    wga_ = store.Add<T>(prefix + ".wg_a", {grank_, d_}, Init::kNormal, sd, true);
    wgb_ = store.Add<T>(prefix + ".wg_b", {pv_, grank_}, Init::kNormal,
                        1.0 / std::sqrt(static_cast<double>(grank_)), true);
    wgb_bias_ = store.Add<T>(prefix + ".wg_b_bias", {pv_}, Init::kZeros, 0, false);
  } else {
    wg_ = store.Add<T>(prefix + ".wg", {pv_, d_}, Init::kNormal, sd, true);
  }
  wo_ = store.Add<T>(prefix + ".wo", {d_, pv_}, Init::kNormal,
                     1.0 / std::sqrt(static_cast<double>(pv_) * 2.0 * c.num_layers), true);
}

template <typename T>
Status KdaLayer<T>::Gates(const T* x, int64_t n, Cache* c) const {
  ORRERY_RETURN_IF_ERROR(kernels::KdaL2NormForward(c->qc, 1e-6f, &c->q, &c->q_rstd));
  ORRERY_RETURN_IF_ERROR(kernels::KdaL2NormForward(c->kc, 1e-6f, &c->k, &c->k_rstd));
  c->fa = Uninit<T>({n, rank_});
  c->z = Uninit<T>({1, n, h_, kd_});
  LinearForward(x, n, d_, fa_, rank_, Ptr<T>(c->fa));
  LinearForward(Ptr<T>(c->fa), n, rank_, fb_, pk_, Ptr<T>(c->z));
  Tensor a_log = Tensor::Wrap({h_}, DTypeOf<T>::value, Device::Cpu(), a_log_.w, nullptr);
  Tensor dt_bias = Tensor::Wrap({pk_}, DTypeOf<T>::value, Device::Cpu(), dt_bias_.w, nullptr);
  const kernels::KdaGateKind kind = c_->kda.gate == GateKind::kBounded
                                        ? kernels::KdaGateKind::kBounded
                                        : kernels::KdaGateKind::kOriginal;
  ORRERY_RETURN_IF_ERROR(kernels::KdaGateForward(
      c->z, a_log, dt_bias, kind, static_cast<float>(c_->kda.gate_lower_bound), &c->g));
  c->beta_logit = Uninit<T>({1, n, h_});
  c->beta = Uninit<T>({1, n, h_});
  LinearForward(x, n, d_, wb_, h_, Ptr<T>(c->beta_logit));
  for (int64_t i = 0; i < n * h_; ++i) Ptr<T>(c->beta)[i] = Sigmoid(Ptr<T>(c->beta_logit)[i]);
  return Status::OK();
}

template <typename T>
void KdaLayer<T>::Output(const T* x, int64_t n, Cache* c, T* y) const {
  // Output RMSNorm over V per head (shared gain), times sigmoid of the output gate.
  c->on = Uninit<T>({n, pv_});
  c->o_rstd = Uninit<T>({n * h_});
  kernels::RmsNormForward(Ptr<T>(c->o), onorm_.w, n * h_, vd_, c_->rms_norm_eps, Ptr<T>(c->on),
                          Ptr<T>(c->o_rstd));
  c->gate = Uninit<T>({n, pv_});
  if (grank_ > 0) {
    c->gate_low = Uninit<T>({n, grank_});
    LinearForward(x, n, d_, wga_, grank_, Ptr<T>(c->gate_low));
    LinearForward(Ptr<T>(c->gate_low), n, grank_, wgb_, pv_, Ptr<T>(c->gate));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < pv_; ++i) Ptr<T>(c->gate)[t * pv_ + i] += wgb_bias_.w[i];
    }
  } else {
    LinearForward(x, n, d_, wg_, pv_, Ptr<T>(c->gate));
  }
  c->og = Uninit<T>({n, pv_});
  for (int64_t i = 0; i < n * pv_; ++i) {
    Ptr<T>(c->og)[i] = Ptr<T>(c->on)[i] * Sigmoid(Ptr<T>(c->gate)[i]);
  }
  LinearForward(Ptr<T>(c->og), n, pv_, wo_, d_, y);
}

template <typename T>
kernels::KdaOptions KdaLayer<T>::CoreOptions(bool final_state) const {
  kernels::KdaOptions opt;
  opt.algorithm =
      c_->kda.recurrent ? kernels::KdaAlgorithm::kRecurrent : kernels::KdaAlgorithm::kChunked;
  opt.chunk_size = static_cast<int>(c_->kda.chunk_size);
  opt.output_final_state = final_state;
  return opt;
}

template <typename T>
Status KdaLayer<T>::Forward(const T* x, int64_t n, const std::vector<int64_t>& cu, T* y,
                            Cache* c) const {
  c->qh = Uninit<T>({n, pk_});
  c->kh = Uninit<T>({n, pk_});
  c->vh = Uninit<T>({n, pv_});
  LinearForward(x, n, d_, wq_, pk_, Ptr<T>(c->qh));
  LinearForward(x, n, d_, wk_, pk_, Ptr<T>(c->kh));
  LinearForward(x, n, d_, wv_, pv_, Ptr<T>(c->vh));
  c->qc = Uninit<T>({1, n, h_, kd_});
  c->kc = Uninit<T>({1, n, h_, kd_});
  c->v = Uninit<T>({1, n, h_, vd_});
  // The conv pre-activations are recomputed in the backward (cheap), so only outputs are kept.
  kernels::ShortConvSiluForward(Ptr<T>(c->qh), pk_, cq_.w, conv_, cu, Ptr<T>(c->qc));
  kernels::ShortConvSiluForward(Ptr<T>(c->kh), pk_, ck_.w, conv_, cu, Ptr<T>(c->kc));
  kernels::ShortConvSiluForward(Ptr<T>(c->vh), pv_, cv_.w, conv_, cu, Ptr<T>(c->v));
  ORRERY_RETURN_IF_ERROR(Gates(x, n, c));
  c->cu = CuTensor(cu);
  kernels::KdaInputs in{c->q, c->k, c->v, c->g, c->beta, Tensor(), c->cu};
  kernels::KdaOutputs out;
  ORRERY_RETURN_IF_ERROR(KdaCoreForward(c_->kda.device, in, CoreOptions(false), &out));
  c->o = out.o;
  Output(x, n, c, y);
  return Status::OK();
}

template <typename T>
Status KdaLayer<T>::Infer(const T* x, int64_t n, const std::vector<int64_t>& cu, T* conv_state,
                          Tensor* state, T* y) const {
  Cache c;
  // Pre-conv projections side by side: [q^ | k^ | v^], width 2*Pk + Pv.
  const int64_t width = 2 * pk_ + pv_, hist = conv_ - 1;
  Tensor proj = NewTensor<T>({n, width});
  {
    Tensor qh = NewTensor<T>({n, pk_}), kh = NewTensor<T>({n, pk_}), vh = NewTensor<T>({n, pv_});
    LinearForward(x, n, d_, wq_, pk_, Ptr<T>(qh));
    LinearForward(x, n, d_, wk_, pk_, Ptr<T>(kh));
    LinearForward(x, n, d_, wv_, pv_, Ptr<T>(vh));
    for (int64_t t = 0; t < n; ++t) {
      T* row = Ptr<T>(proj) + t * width;
      std::copy_n(Ptr<T>(qh) + t * pk_, pk_, row);
      std::copy_n(Ptr<T>(kh) + t * pk_, pk_, row + pk_);
      std::copy_n(Ptr<T>(vh) + t * pv_, pv_, row + 2 * pk_);
    }
  }
  // Short conv + SiLU over [conv history ; new rows] per segment; the history becomes the last
  // conv_size - 1 rows of that window.
  c.qc = NewTensor<T>({1, n, h_, kd_});
  c.kc = NewTensor<T>({1, n, h_, kd_});
  c.v = NewTensor<T>({1, n, h_, vd_});
  std::vector<T> window;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t m = cu[s + 1] - cu[s];
    T* h = conv_state + static_cast<int64_t>(s) * hist * width;
    window.assign(h, h + hist * width);
    window.insert(window.end(), Ptr<T>(proj) + cu[s] * width, Ptr<T>(proj) + cu[s + 1] * width);
    for (int64_t t = 0; t < m; ++t) {
      for (int64_t ch = 0; ch < width; ++ch) {
        const T* wc = ch < pk_       ? cq_.w + ch * conv_
                      : ch < 2 * pk_ ? ck_.w + (ch - pk_) * conv_
                                     : cv_.w + (ch - 2 * pk_) * conv_;
        T acc = 0;
        for (int64_t j = 0; j < conv_; ++j) acc += wc[j] * window[(t + j) * width + ch];
        const T out = acc * Sigmoid(acc);
        const int64_t row = cu[s] + t;
        if (ch < pk_) {
          Ptr<T>(c.qc)[row * pk_ + ch] = out;
        } else if (ch < 2 * pk_) {
          Ptr<T>(c.kc)[row * pk_ + ch - pk_] = out;
        } else {
          Ptr<T>(c.v)[row * pv_ + ch - 2 * pk_] = out;
        }
      }
    }
    std::copy(window.end() - hist * width, window.end(), h);
  }
  ORRERY_RETURN_IF_ERROR(Gates(x, n, &c));
  const int64_t segments = static_cast<int64_t>(cu.size()) - 1;
  if (segments == n) {
    // One token per sequence: the decode step, on the CPU whatever [model.kda] device says (the
    // state lives on the host between steps; a single token is too little work to ship).
    ORRERY_ASSIGN_OR_RETURN(Tensor q, c.q.Reshape({n, h_, kd_}));
    ORRERY_ASSIGN_OR_RETURN(Tensor k, c.k.Reshape({n, h_, kd_}));
    ORRERY_ASSIGN_OR_RETURN(Tensor v, c.v.Reshape({n, h_, vd_}));
    ORRERY_ASSIGN_OR_RETURN(Tensor g, c.g.Reshape({n, h_, kd_}));
    ORRERY_ASSIGN_OR_RETURN(Tensor beta, c.beta.Reshape({n, h_}));
    Tensor o;
    ORRERY_RETURN_IF_ERROR(kernels::KdaDecodeStep(q, k, v, g, beta, 0.0f, state, &o));
    ORRERY_ASSIGN_OR_RETURN(c.o, o.Reshape({1, n, h_, vd_}));
  } else {
    kernels::KdaInputs in{c.q, c.k, c.v, c.g, c.beta, *state, CuTensor(cu)};
    kernels::KdaOutputs out;
    ORRERY_RETURN_IF_ERROR(KdaCoreForward(c_->kda.device, in, CoreOptions(true), &out));
    ORRERY_RETURN_IF_ERROR(state->CopyFrom(out.final_state));
    c.o = out.o;
  }
  Output(x, n, &c, y);
  return Status::OK();
}

template <typename T>
Status KdaLayer<T>::Backward(const T* x, int64_t n, const std::vector<int64_t>& cu, const Cache& c,
                             const T* dy, T* dx) const {
  Tensor dog = NewTensor<T>({n, pv_});
  LinearBackward(Ptr<T>(c.og), n, pv_, wo_, d_, dy, Ptr<T>(dog));
  Tensor don = Uninit<T>({n, pv_}), dgate = Uninit<T>({n, pv_});
  for (int64_t i = 0; i < n * pv_; ++i) {
    const T s = Sigmoid(Ptr<T>(c.gate)[i]);
    Ptr<T>(don)[i] = Ptr<T>(dog)[i] * s;
    Ptr<T>(dgate)[i] = Ptr<T>(dog)[i] * Ptr<T>(c.on)[i] * s * (T(1) - s);
  }
  if (grank_ > 0) {
    Tensor dlow = NewTensor<T>({n, grank_});
    LinearBackward(Ptr<T>(c.gate_low), n, grank_, wgb_, pv_, Ptr<T>(dgate), Ptr<T>(dlow));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < pv_; ++i) wgb_bias_.g[i] += Ptr<T>(dgate)[t * pv_ + i];
    }
    LinearBackward(x, n, d_, wga_, grank_, Ptr<T>(dlow), dx);
  } else {
    LinearBackward(x, n, d_, wg_, pv_, Ptr<T>(dgate), dx);
  }
  Tensor d_o = Uninit<T>({1, n, h_, vd_});
  kernels::RmsNormBackward(Ptr<T>(c.o), onorm_.w, Ptr<T>(c.o_rstd), Ptr<T>(don), n * h_, vd_,
                           Ptr<T>(d_o), onorm_.g);
  kernels::KdaInputs in{c.q, c.k, c.v, c.g, c.beta, Tensor(), c.cu};
  kernels::KdaGrads grads;
  ORRERY_RETURN_IF_ERROR(
      KdaCoreBackward(c_->kda.device, in, d_o, Tensor(), CoreOptions(false), &grads));
  // beta = sigmoid(W_b x).
  Tensor dbl = Uninit<T>({n, h_});
  for (int64_t i = 0; i < n * h_; ++i) {
    const T b = Ptr<T>(c.beta)[i];
    Ptr<T>(dbl)[i] = Ptr<T>(grads.dbeta)[i] * b * (T(1) - b);
  }
  LinearBackward(x, n, d_, wb_, h_, Ptr<T>(dbl), dx);
  // Gate and decay logits.
  Tensor a_log = Tensor::Wrap({h_}, DTypeOf<T>::value, Device::Cpu(), a_log_.w, nullptr);
  Tensor dt_bias = Tensor::Wrap({pk_}, DTypeOf<T>::value, Device::Cpu(), dt_bias_.w, nullptr);
  const kernels::KdaGateKind kind = c_->kda.gate == GateKind::kBounded
                                        ? kernels::KdaGateKind::kBounded
                                        : kernels::KdaGateKind::kOriginal;
  Tensor dz, da_log, ddt;
  ORRERY_RETURN_IF_ERROR(kernels::KdaGateBackward(c.z, a_log, dt_bias, kind,
                                                  static_cast<float>(c_->kda.gate_lower_bound),
                                                  grads.dg, &dz, &da_log, &ddt));
  for (int64_t i = 0; i < h_; ++i) a_log_.g[i] += Ptr<T>(da_log)[i];
  for (int64_t i = 0; i < pk_; ++i) dt_bias_.g[i] += Ptr<T>(ddt)[i];
  Tensor dfa = NewTensor<T>({n, rank_});
  LinearBackward(Ptr<T>(c.fa), n, rank_, fb_, pk_, Ptr<T>(dz), Ptr<T>(dfa));
  LinearBackward(x, n, d_, fa_, rank_, Ptr<T>(dfa), dx);
  // L2 norms, conv + SiLU, projections.
  Tensor dqc, dkc;
  ORRERY_RETURN_IF_ERROR(kernels::KdaL2NormBackward(c.q, c.q_rstd, grads.dq, &dqc));
  ORRERY_RETURN_IF_ERROR(kernels::KdaL2NormBackward(c.k, c.k_rstd, grads.dk, &dkc));
  struct Stream {
    const Tensor& pre_in;
    const Param<T>& conv;
    const Param<T>& proj;
    int64_t p;
    const T* dy;
  };
  const Stream streams[3] = {{c.qh, cq_, wq_, pk_, Ptr<T>(dqc)},
                             {c.kh, ck_, wk_, pk_, Ptr<T>(dkc)},
                             {c.vh, cv_, wv_, pv_, Ptr<T>(grads.dv)}};
  for (const Stream& s : streams) {
    Tensor dh = Uninit<T>({n, s.p});
    kernels::ShortConvSiluBackward(Ptr<T>(s.pre_in), s.p, s.conv.w, conv_, cu, s.dy, Ptr<T>(dh),
                                   s.conv.g);
    LinearBackward(x, n, d_, s.proj, s.p, Ptr<T>(dh), dx);
  }
  return Status::OK();
}

template class KdaLayer<float>;
template class KdaLayer<double>;

}  // namespace orrery::model
