// Internal to model/: the layers of the hybrid stack with explicit forward and backward, generic
// over float and double (explicitly instantiated in model/layers/*.cc). Activations are N packed
// token rows [N, D]; `cu` holds the document offsets into N (spec §7 packed sequences).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/kda.h"
#include "kernels/situ.h"
#include "model/config.h"
#include "model/model.h"

namespace orrery::model {

// A parameter's value and gradient buffers.
template <typename T>
struct Param {
  T* w = nullptr;
  T* g = nullptr;
  int64_t numel = 0;
};

enum class Init { kZeros, kOnes, kNormal, kKdaALog, kKdaDtBias };

// Creates parameters with deterministic Philox initialisation (stream = parameter index).
class ParamStore {
 public:
  ParamStore(std::vector<Parameter>* params, uint64_t seed, DType dtype, const ModelConfig* config)
      : params_(params), seed_(seed), dtype_(dtype), config_(config) {}
  // kNormal draws N(0, std^2).
  template <typename T>
  Param<T> Add(const std::string& name, Shape shape, Init init, double std, bool weight_decay);

 private:
  std::vector<Parameter>* params_;
  uint64_t seed_;
  DType dtype_;
  const ModelConfig* config_;
};

// Typed data pointer of a tensor (a free function, so templates need no `.template data<T>()`).
template <typename T>
T* Ptr(const Tensor& t) {
  return t.data<T>();
}

// A zero-filled buffer, for outputs that are accumulated into (+=).
template <typename T>
Tensor NewTensor(Shape shape) {
  return Tensor::Zeros(std::move(shape), DTypeOf<T>::value);
}

// An uninitialised buffer, for outputs the next call overwrites entirely (a product with beta 0,
// an elementwise map, a norm): skips NewTensor's zero fill, which cost ~7% of a training step.
template <typename T>
Tensor Uninit(Shape shape) {
  return Tensor::Empty(std::move(shape), DTypeOf<T>::value);
}

// y[n, out] = x[n, in] W^T (W is [out, in]).
template <typename T>
void LinearForward(const T* x, int64_t n, int64_t in, const Param<T>& w, int64_t out, T* y);
// dW += dy^T x; dx += dy W (dx may be null).
template <typename T>
void LinearBackward(const T* x, int64_t n, int64_t in, const Param<T>& w, int64_t out, const T* dy,
                    T* dx);

kernels::GluActivation ActivationOf(const ModelConfig& c);

// ---- dense SiTU/SiLU GLU MLP: y = W2 glu(W1 x, W3 x) ----
template <typename T>
class GluMlp {
 public:
  GluMlp() = default;
  GluMlp(ParamStore& store, const ModelConfig& c, const std::string& prefix, int64_t in,
         int64_t hidden);
  struct Cache {
    Tensor a, u, h;
  };
  void Forward(const T* x, int64_t n, T* y, Cache* cache) const;  // y is overwritten
  void Backward(const T* x, int64_t n, const Cache& cache, const T* dy, T* dx) const;  // dx +=
  int64_t hidden() const { return hidden_; }

 private:
  kernels::GluActivation act_;
  int64_t in_ = 0, hidden_ = 0;
  Param<T> w1_, w3_, w2_;
};

// ---- the KDA layer (spec §2.1) ----
template <typename T>
class KdaLayer {
 public:
  KdaLayer(ParamStore& store, const ModelConfig& c, const std::string& prefix);
  struct Cache {
    Tensor qh, kh, vh;  // projections before the conv [N, P]
    Tensor q, k, v;     // after conv + SiLU (q, k L2-normalised) [N, H, K|V]
    Tensor qc, kc;      // after conv + SiLU, before the L2 norm
    Tensor q_rstd, k_rstd;
    Tensor fa, z, g, beta_logit, beta;
    Tensor o, o_rstd, on, gate_low, gate, og;
    Tensor cu;  // i64
  };
  Status Forward(const T* x, int64_t n, const std::vector<int64_t>& cu, T* y, Cache* cache) const;
  Status Backward(const T* x, int64_t n, const std::vector<int64_t>& cu, const Cache& cache,
                  const T* dy, T* dx) const;
  // Inference over segments (cu: offsets into the n rows of x; segment i continues a sequence).
  // conv_state [segments, conv_size - 1, 2*Pk + Pv] holds the last pre-conv q|k|v projections and
  // state [segments, H, K, V] the recurrent state; both are read and advanced in place. Segments
  // of one token each take the decode step (kernels KdaDecodeStep), others the chunked core with
  // initial and final states.
  Status Infer(const T* x, int64_t n, const std::vector<int64_t>& cu, T* conv_state, Tensor* state,
               T* y) const;

 private:
  // q, k L2 norms (from qc, kc), decay logits, gate g and beta; fills the matching Cache fields.
  Status Gates(const T* x, int64_t n, Cache* c) const;
  // Output RMSNorm times the sigmoid gate, then W_o: y from c->o; fills on, o_rstd, gate*, og.
  void Output(const T* x, int64_t n, Cache* c, T* y) const;
  kernels::KdaOptions CoreOptions(bool final_state) const;
  const ModelConfig* c_;
  int64_t d_, h_, kd_, vd_, pk_, pv_, conv_, rank_, grank_;
  Param<T> wq_, wk_, wv_, cq_, ck_, cv_, fa_, fb_, a_log_, dt_bias_, wb_, onorm_, wg_, wga_, wgb_,
      wgb_bias_, wo_;
};

// ---- gated MLA without positions (spec §3) ----
template <typename T>
class MlaLayer {
 public:
  MlaLayer(ParamStore& store, const ModelConfig& c, const std::string& prefix);
  struct Cache {
    Tensor qa, qa_rstd, qan, q, ckr, c_rstd, chat, kv, k, v, o, lse, gate_logit, og;
  };
  void Forward(const T* x, int64_t n, const std::vector<int64_t>& cu, T* y, Cache* cache) const;
  void Backward(const T* x, int64_t n, const std::vector<int64_t>& cu, const Cache& cache,
                const T* dy, T* dx) const;
  // Inference over segments in the absorbed form (spec §3.3): segment i (rows cu[i]..cu[i+1] of
  // x) writes its tokens' latent rows [c-hat | k^R] into caches[i] after the past[i] rows already
  // there (room must exist), then each token attends causally over its sequence's cache with the
  // absorbed query q~_h = W_UK,h^T q^N_h, and o_h = W_UV,h sum_j p_j c-hat_j.
  void Infer(const T* x, int64_t n, const std::vector<int64_t>& cu, const std::vector<T*>& caches,
             const std::vector<int64_t>& past, T* y) const;
  int64_t latent_width() const { return dc_ + dr_; }

 private:
  // q [n, H, dqk] (through the q LoRA when configured); fills c->q (and qa, qan, qa_rstd).
  void Queries(const T* x, int64_t n, Cache* c) const;
  // The output gate and projection: y = W_o (o * sigmoid(W_g x)); fills gate_logit and og.
  void Output(const T* x, int64_t n, Cache* c, T* y) const;
  const ModelConfig* c_;
  int64_t d_, h_, ql_, dc_, dn_, dr_, dv_, dqk_;
  double scale_;
  Param<T> wq_, wqa_, qnorm_, wqb_, wkva_, kvnorm_, wkvb_, wg_, wo_;
};

// ---- Stable LatentMoE (spec §5) ----
template <typename T>
class MoeLayer {
 public:
  MoeLayer(ParamStore& store, const ModelConfig& c, const std::string& prefix);
  struct Cache {
    Tensor logits, scores, ids, weights, xl, yl, yl_rstd, yln;
    std::vector<std::vector<int64_t>> rows;  // per expert: flat (token * top_k + slot) indices
    std::vector<Tensor> xe, a, u, h, oe;     // per expert
    typename GluMlp<T>::Cache shared;
  };
  // forced: null or [n, top_k] ids. bias: f32 [E] used for selection only.
  Status Forward(const T* x, int64_t n, const int32_t* forced, const float* bias, T* y,
                 Cache* cache) const;
  void Backward(const T* x, int64_t n, const Cache& cache, const T* dy, T* dx) const;

 private:
  const ModelConfig* c_;
  int64_t d_, e_, k_, f_, l_;
  Param<T> router_, down_, up_, lnorm_;
  std::vector<Param<T>> w1_, w3_, w2_;
  GluMlp<T> shared_;
  bool has_shared_ = false;
};

// Top-k selection on biased scores (ties broken by the lower expert id); ids [n, k].
template <typename T>
void SelectTopK(const T* scores, const float* bias, int64_t n, int64_t e, int64_t k, int32_t* ids);

}  // namespace orrery::model
