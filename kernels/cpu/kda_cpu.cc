// CPU dispatch of the KDA op: output allocation, algorithm choice, and the decode step.
#include "kernels/cpu/kda_cpu.h"

#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/kda_state_io.h"

namespace orrery::kernels::cpu {

Status KdaForwardCpu(const KdaProblem& p, const KdaInputs& in, bool output_final_state,
                     KdaOutputs* out) {
  out->o = Tensor::Empty(in.v.shape(), p.dtype);
  out->final_state = Tensor();
  if (output_final_state) {
    out->final_state =
        Tensor::Empty({p.num_sequences(), p.heads, p.key_dim, p.value_dim}, KdaStateDType(p.dtype));
  }
  if (p.algorithm == KdaAlgorithm::kRecurrent) {
    return KdaRecurrentForwardCpu(p, in, &out->o, &out->final_state);
  }
  return KdaChunkedForwardCpu(p, in, &out->o, &out->final_state);
}

Status KdaBackwardCpu(const KdaProblem& p, const KdaInputs& in, const Tensor& d_o,
                      const Tensor& d_final_state, KdaGrads* grads) {
  grads->dq = Tensor::Zeros(in.q.shape(), p.dtype);
  grads->dk = Tensor::Zeros(in.k.shape(), p.dtype);
  grads->dv = Tensor::Zeros(in.v.shape(), p.dtype);
  grads->dg = Tensor::Zeros(in.g.shape(), p.dtype);
  grads->dbeta = Tensor::Zeros(in.beta.shape(), p.dtype);
  grads->dinitial_state = Tensor();
  if (in.initial_state.defined()) {
    grads->dinitial_state = Tensor::Empty(in.initial_state.shape(), in.initial_state.dtype());
  }
  if (p.algorithm == KdaAlgorithm::kRecurrent) {
    return KdaRecurrentBackwardCpu(p, in, d_o, d_final_state, grads);
  }
  return KdaChunkedBackwardCpu(p, in, d_o, d_final_state, grads);
}

namespace {

// One recurrent step per (sequence, head), the same arithmetic as KdaRecurrentForwardCpu.
template <typename T, typename S>
void DecodeStep(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                const Tensor& beta, T scale, Tensor* state, Tensor* o) {
  const int64_t n = q.dim(0), h = q.dim(1), kd = q.dim(2), vd = v.dim(2);
  const T* qp = q.data<T>();
  const T* kp = k.data<T>();
  const T* vp = v.data<T>();
  const T* gp = g.data<T>();
  const T* bp = beta.data<T>();
  S* sp = state->data<S>();
  T* op = o->data<T>();
  ThreadPool::Default().ParallelFor(n * h, 4, [&](int64_t begin, int64_t end) {
    std::vector<T> u(vd);
    for (int64_t i = begin; i < end; ++i) {
      const T* qi = qp + i * kd;
      const T* ki = kp + i * kd;
      const T* gi = gp + i * kd;
      const T* vi = vp + i * vd;
      S* si = sp + i * kd * vd;
      for (int64_t c = 0; c < vd; ++c) u[c] = 0;
      for (int64_t d = 0; d < kd; ++d) {
        const T a = std::exp(gi[d]);
        S* row = si + d * vd;
        for (int64_t c = 0; c < vd; ++c) {
          row[c] = static_cast<S>(row[c] * a);
          u[c] += ki[d] * static_cast<T>(row[c]);
        }
      }
      const T b = bp[i];
      for (int64_t c = 0; c < vd; ++c) u[c] = b * (vi[c] - u[c]);
      T* oi = op + i * vd;
      for (int64_t c = 0; c < vd; ++c) oi[c] = 0;
      for (int64_t d = 0; d < kd; ++d) {
        S* row = si + d * vd;
        const T qd = scale * qi[d];
        for (int64_t c = 0; c < vd; ++c) {
          row[c] = static_cast<S>(row[c] + ki[d] * u[c]);
          oi[c] += qd * static_cast<T>(row[c]);
        }
      }
    }
  });
}

}  // namespace

Status KdaDecodeStepCpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                        const Tensor& beta, float scale, Tensor* state, Tensor* o) {
  if (q.dtype() == DType::kF64) {
    if (state->dtype() == DType::kF64) {
      DecodeStep<double, double>(q, k, v, g, beta, scale, state, o);
    } else {
      DecodeStep<double, float>(q, k, v, g, beta, scale, state, o);
    }
  } else {
    DecodeStep<float, float>(q, k, v, g, beta, scale, state, o);
  }
  return Status::OK();
}

}  // namespace orrery::kernels::cpu
