// The token-by-token KDA recurrence (spec §2.3), forward and backward: the gold oracle.
//
// Per token, with S the K x V state:  S <- Diag(exp g) S;  u = beta (v - S^T k);  S <- S + k u^T;
// o = S^T (scale q). The backward re-runs the forward from states checkpointed every
// kSegment tokens, then walks each segment in reverse with the states of that segment.
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/kda_cpu.h"
#include "kernels/cpu/kda_state_io.h"

namespace orrery::kernels::cpu {
namespace {

constexpr int64_t kSegment = 64;

template <typename T>
struct HeadView {
  const T *q, *k, *v, *g, *beta;
  int64_t qk_stride, v_stride, beta_stride;  // elements between consecutive tokens
};

template <typename T>
HeadView<T> ViewHead(const KdaProblem& p, const KdaInputs& in, int64_t row, int64_t h) {
  return {in.q.data<T>() + (row * p.heads + h) * p.key_dim,
          in.k.data<T>() + (row * p.heads + h) * p.key_dim,
          in.v.data<T>() + (row * p.heads + h) * p.value_dim,
          in.g.data<T>() + (row * p.heads + h) * p.key_dim,
          in.beta.data<T>() + row * p.heads + h,
          p.heads * p.key_dim,
          p.heads * p.value_dim,
          p.heads};
}

// Advances state s by token t of view x; writes o (may be null) and u [V] (the delta).
template <typename T>
void Step(const HeadView<T>& x, int64_t t, int64_t kd, int64_t vd, T scale, T* s, T* u, T* o) {
  const T* q = x.q + t * x.qk_stride;
  const T* k = x.k + t * x.qk_stride;
  const T* g = x.g + t * x.qk_stride;
  const T* v = x.v + t * x.v_stride;
  for (int64_t c = 0; c < vd; ++c) u[c] = 0;
  for (int64_t d = 0; d < kd; ++d) {
    const T a = std::exp(g[d]);
    T* row = s + d * vd;
    for (int64_t c = 0; c < vd; ++c) {
      row[c] = row[c] * a;
      u[c] += k[d] * row[c];
    }
  }
  const T b = x.beta[t * x.beta_stride];
  for (int64_t c = 0; c < vd; ++c) u[c] = b * (v[c] - u[c]);
  if (o != nullptr) {
    for (int64_t c = 0; c < vd; ++c) o[c] = 0;
  }
  for (int64_t d = 0; d < kd; ++d) {
    T* row = s + d * vd;
    const T qd = scale * q[d];
    for (int64_t c = 0; c < vd; ++c) {
      row[c] = row[c] + k[d] * u[c];
      if (o != nullptr) o[c] += qd * row[c];
    }
  }
}

template <typename T>
void Forward(const KdaProblem& p, const KdaInputs& in, Tensor* o, Tensor* final_state) {
  const int64_t kd = p.key_dim, vd = p.value_dim, heads = p.heads;
  const T scale = static_cast<T>(p.scale);
  ThreadPool::Default().ParallelFor(p.num_sequences() * heads, 1, [&](int64_t b, int64_t e) {
    std::vector<T> s(kd * vd), u(vd);
    for (int64_t item = b; item < e; ++item) {
      const int64_t n = item / heads, h = item % heads;
      const int64_t bos = p.seq_start[n], len = p.seq_start[n + 1] - bos;
      LoadState(in.initial_state, n, h, p, s.data());
      const HeadView<T> x = ViewHead<T>(p, in, bos, h);
      T* out = o->data<T>() + (bos * heads + h) * vd;
      for (int64_t t = 0; t < len; ++t) {
        Step(x, t, kd, vd, scale, s.data(), u.data(), out + t * heads * vd);
      }
      if (final_state->defined()) StoreState(s.data(), n, h, p, *final_state);
    }
  });
}

template <typename T>
void Backward(const KdaProblem& p, const KdaInputs& in, const Tensor& d_o,
              const Tensor& d_final_state, KdaGrads* grads) {
  const int64_t kd = p.key_dim, vd = p.value_dim, kv = kd * vd, heads = p.heads;
  const T scale = static_cast<T>(p.scale);
  ThreadPool::Default().ParallelFor(p.num_sequences() * heads, 1, [&](int64_t b, int64_t e) {
    std::vector<T> ds(kv), ds1(kv), s1(kv), u(vd), du(vd), dp(vd), checkpoints, states;
    for (int64_t item = b; item < e; ++item) {
      const int64_t n = item / heads, h = item % heads;
      const int64_t bos = p.seq_start[n], len = p.seq_start[n + 1] - bos;
      const int64_t segments = (len + kSegment - 1) / kSegment;
      const HeadView<T> x = ViewHead<T>(p, in, bos, h);
      // Forward: the state at the start of every segment.
      checkpoints.assign((segments + 1) * kv, T(0));
      LoadState(in.initial_state, n, h, p, checkpoints.data());
      std::vector<T> s(checkpoints.begin(), checkpoints.begin() + kv);
      for (int64_t t = 0; t < len; ++t) {
        if (t % kSegment == 0)
          std::copy(s.begin(), s.end(), checkpoints.begin() + (t / kSegment) * kv);
        Step(x, t, kd, vd, scale, s.data(), u.data(), static_cast<T*>(nullptr));
      }
      LoadState(d_final_state, n, h, p, ds.data());
      const int64_t qk_row = heads * kd, v_row = heads * vd;
      const int64_t qk_off = (bos * heads + h) * kd, v_off = (bos * heads + h) * vd;
      const T* dop = d_o.data<T>() + v_off;
      T* dq = grads->dq.data<T>() + qk_off;
      T* dk = grads->dk.data<T>() + qk_off;
      T* dg = grads->dg.data<T>() + qk_off;
      T* dv = grads->dv.data<T>() + v_off;
      T* dbeta = grads->dbeta.data<T>() + bos * heads + h;
      for (int64_t seg = segments - 1; seg >= 0; --seg) {
        const int64_t t0 = seg * kSegment, t1 = std::min(len, t0 + kSegment);
        // states[i] = state before token t0 + i (before its decay).
        states.resize((t1 - t0 + 1) * kv);
        std::copy(checkpoints.begin() + seg * kv, checkpoints.begin() + (seg + 1) * kv,
                  states.begin());
        for (int64_t t = t0; t < t1; ++t) {
          std::copy(states.begin() + (t - t0) * kv, states.begin() + (t - t0 + 1) * kv,
                    states.begin() + (t - t0 + 1) * kv);
          Step(x, t, kd, vd, scale, states.data() + (t - t0 + 1) * kv, u.data(),
               static_cast<T*>(nullptr));
        }
        for (int64_t t = t1 - 1; t >= t0; --t) {
          const T* s0 = states.data() + (t - t0) * kv;
          const T* s2 = states.data() + (t - t0 + 1) * kv;
          const T* q = x.q + t * x.qk_stride;
          const T* k = x.k + t * x.qk_stride;
          const T* g = x.g + t * x.qk_stride;
          const T* v = x.v + t * x.v_stride;
          const T bt = x.beta[t * x.beta_stride];
          const T* dot = dop + t * v_row;
          // S1 = Diag(a) S0, p = S1^T k, u = beta (v - p).
          for (int64_t c = 0; c < vd; ++c) dp[c] = 0;
          for (int64_t d = 0; d < kd; ++d) {
            const T a = std::exp(g[d]);
            for (int64_t c = 0; c < vd; ++c) {
              s1[d * vd + c] = s0[d * vd + c] * a;
              dp[c] += k[d] * s1[d * vd + c];
            }
          }
          for (int64_t c = 0; c < vd; ++c) u[c] = bt * (v[c] - dp[c]);  // dp holds p here
          // dS2 = dS + scale q do^T;  dq = scale S2 do;  dk = dS2 u;  du = dS2^T k.
          for (int64_t c = 0; c < vd; ++c) du[c] = 0;
          for (int64_t d = 0; d < kd; ++d) {
            T dqd = 0, dkd = 0;
            for (int64_t c = 0; c < vd; ++c) {
              const T v2 = ds[d * vd + c] + scale * q[d] * dot[c];
              ds[d * vd + c] = v2;
              dqd += s2[d * vd + c] * dot[c];
              dkd += v2 * u[c];
              du[c] += v2 * k[d];
            }
            dq[t * qk_row + d] = scale * dqd;
            dk[t * qk_row + d] = dkd;
          }
          T dbt = 0;
          for (int64_t c = 0; c < vd; ++c) {
            dbt += du[c] * (v[c] - dp[c]);
            dv[t * v_row + c] = bt * du[c];
            dp[c] = -bt * du[c];  // now the gradient of p
          }
          dbeta[t * heads] = dbt;
          // dS1 = dS2 + k dp^T;  dk += S1 dp;  dg = a * sum_v S0 dS1;  dS0 = Diag(a) dS1.
          for (int64_t d = 0; d < kd; ++d) {
            const T a = std::exp(g[d]);
            T dkd = 0, dgd = 0;
            for (int64_t c = 0; c < vd; ++c) {
              const T v1 = ds[d * vd + c] + k[d] * dp[c];
              dkd += s1[d * vd + c] * dp[c];
              dgd += s0[d * vd + c] * v1;
              ds[d * vd + c] = a * v1;
            }
            dk[t * qk_row + d] += dkd;
            dg[t * qk_row + d] = a * dgd;
          }
        }
      }
      if (grads->dinitial_state.defined()) StoreState(ds.data(), n, h, p, grads->dinitial_state);
    }
  });
}

}  // namespace

Status KdaRecurrentForwardCpu(const KdaProblem& p, const KdaInputs& in, Tensor* o,
                              Tensor* final_state) {
  if (p.dtype == DType::kF64) {
    Forward<double>(p, in, o, final_state);
  } else {
    Forward<float>(p, in, o, final_state);
  }
  return Status::OK();
}

Status KdaRecurrentBackwardCpu(const KdaProblem& p, const KdaInputs& in, const Tensor& d_o,
                               const Tensor& d_final_state, KdaGrads* grads) {
  if (p.dtype == DType::kF64) {
    Backward<double>(p, in, d_o, d_final_state, grads);
  } else {
    Backward<float>(p, in, d_o, d_final_state, grads);
  }
  return Status::OK();
}

}  // namespace orrery::kernels::cpu
