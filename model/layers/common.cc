#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/philox.h"
#include "core/thread_pool.h"
#include "kernels/gemm.h"
#include "model/layers.h"

namespace orrery::model {

template <typename T>
Param<T> ParamStore::Add(const std::string& name, Shape shape, Init init, double std,
                         bool weight_decay) {
  const uint64_t stream = params_->size();
  Tensor value = Tensor::Zeros(shape, dtype_);
  T* w = Ptr<T>(value);
  const int64_t n = value.numel();
  // Counter-based draws (element i of stream `stream`): the same values on any number of threads,
  // and a 1B-parameter model initialises in seconds rather than a minute on one core.
  ThreadPool::Default().ParallelFor(n, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      switch (init) {
        case Init::kZeros:
          w[i] = 0;
          break;
        case Init::kOnes:
          w[i] = 1;
          break;
        case Init::kNormal:
          w[i] = static_cast<T>(std * PhiloxNormal(seed_, stream, static_cast<uint64_t>(i)));
          break;
        case Init::kKdaALog:
          // Bounded gate: A = 0 (e^A = 1, fla's safe_gate init); original: log U(1, 16).
          w[i] = config_->kda.gate == GateKind::kBounded
                     ? T(0)
                     : static_cast<T>(std::log(1.0 + 15.0 * PhiloxUniform(seed_, stream, i)));
          break;
        case Init::kKdaDtBias: {
          // softplus^-1(dt), dt = exp(U(log 1e-3, log 1e-1)) clamped >= 1e-4 (spec §2.2).
          const double u = PhiloxUniform(seed_, stream, static_cast<uint64_t>(i));
          const double dt =
              std::max(1e-4, std::exp(std::log(1e-3) + u * (std::log(1e-1) - std::log(1e-3))));
          w[i] = static_cast<T>(dt + std::log(-std::expm1(-dt)));
          break;
        }
      }
    }
  });
  Parameter p{name, value, Tensor::Zeros(std::move(shape), dtype_), weight_decay};
  Param<T> out{w, Ptr<T>(p.grad), n};
  params_->push_back(std::move(p));
  return out;
}

template <typename T>
void LinearForward(const T* x, int64_t n, int64_t in, const Param<T>& w, int64_t out, T* y) {
  if (n == 0) return;
  kernels::Gemm(false, true, n, out, in, T(1), x, w.w, T(0), y);
}

template <typename T>
void LinearBackward(const T* x, int64_t n, int64_t in, const Param<T>& w, int64_t out, const T* dy,
                    T* dx) {
  if (n == 0) return;
  kernels::Gemm(true, false, out, in, n, T(1), dy, x, T(1), w.g);
  if (dx) kernels::Gemm(false, false, n, in, out, T(1), dy, w.w, T(1), dx);
}

kernels::GluActivation ActivationOf(const ModelConfig& c) {
  kernels::GluActivation a;
  a.situ = c.activation == Activation::kSitu;
  a.beta = c.situ_beta;
  a.beta_lin = c.situ_linear_beta;
  return a;
}

template <typename T>
GluMlp<T>::GluMlp(ParamStore& store, const ModelConfig& c, const std::string& prefix, int64_t in,
                  int64_t hidden)
    : act_(ActivationOf(c)), in_(in), hidden_(hidden) {
  const double s_in = 1.0 / std::sqrt(static_cast<double>(in));
  const double s_out = 1.0 / std::sqrt(static_cast<double>(hidden) * 2.0 * c.num_layers);
  w1_ = store.Add<T>(prefix + ".w1", {hidden, in}, Init::kNormal, s_in, true);
  w3_ = store.Add<T>(prefix + ".w3", {hidden, in}, Init::kNormal, s_in, true);
  w2_ = store.Add<T>(prefix + ".w2", {in, hidden}, Init::kNormal, s_out, true);
}

template <typename T>
void GluMlp<T>::Forward(const T* x, int64_t n, T* y, Cache* c) const {
  c->a = Uninit<T>({n, hidden_});
  c->u = Uninit<T>({n, hidden_});
  c->h = Uninit<T>({n, hidden_});
  LinearForward(x, n, in_, w1_, hidden_, Ptr<T>(c->a));
  LinearForward(x, n, in_, w3_, hidden_, Ptr<T>(c->u));
  kernels::GluForward(act_, Ptr<T>(c->a), Ptr<T>(c->u), n * hidden_, Ptr<T>(c->h));
  LinearForward(Ptr<T>(c->h), n, hidden_, w2_, in_, y);
}

template <typename T>
void GluMlp<T>::Backward(const T* x, int64_t n, const Cache& c, const T* dy, T* dx) const {
  Tensor dh = NewTensor<T>({n, hidden_}), da = Uninit<T>({n, hidden_}),
         du = Uninit<T>({n, hidden_});
  LinearBackward(Ptr<T>(c.h), n, hidden_, w2_, in_, dy, Ptr<T>(dh));
  kernels::GluBackward(act_, Ptr<T>(c.a), Ptr<T>(c.u), Ptr<T>(dh), n * hidden_, Ptr<T>(da),
                       Ptr<T>(du));
  LinearBackward(x, n, in_, w1_, hidden_, Ptr<T>(da), dx);
  LinearBackward(x, n, in_, w3_, hidden_, Ptr<T>(du), dx);
}

template <typename T>
void SelectTopK(const T* scores, const float* bias, int64_t n, int64_t e, int64_t k, int32_t* ids) {
  std::vector<int32_t> order(static_cast<size_t>(e));
  for (int64_t t = 0; t < n; ++t) {
    const T* s = scores + t * e;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      const double va = static_cast<double>(s[a]) + (bias ? bias[a] : 0.0f);
      const double vb = static_cast<double>(s[b]) + (bias ? bias[b] : 0.0f);
      return va > vb || (va == vb && a < b);
    });
    std::copy(order.begin(), order.begin() + k, ids + t * k);
  }
}

#define ORRERY_INSTANTIATE(T)                                                                     \
  template Param<T> ParamStore::Add<T>(const std::string&, Shape, Init, double, bool);            \
  template void LinearForward<T>(const T*, int64_t, int64_t, const Param<T>&, int64_t, T*);       \
  template void LinearBackward<T>(const T*, int64_t, int64_t, const Param<T>&, int64_t, const T*, \
                                  T*);                                                            \
  template class GluMlp<T>;                                                                       \
  template void SelectTopK<T>(const T*, const float*, int64_t, int64_t, int64_t, int32_t*);
ORRERY_INSTANTIATE(float)
ORRERY_INSTANTIATE(double)
#undef ORRERY_INSTANTIATE

}  // namespace orrery::model
