// KdaInputTransforms (kernels/kda.h) applied around the KDA recurrence: the raw inputs turned
// into the recurrence's inputs before it, and the gradients of the recurrence's inputs turned
// into the raw inputs' after it. Internal to kernels/; by device: the CPU reference functions of
// kernels/cpu/kda_gate.cc, or one elementwise CUDA pass each way
// (kernels/cuda/kda_input_transforms.cu).
#pragma once

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/kda.h"
#include "kernels/kda_problem.h"

namespace orrery::kernels {

// The recurrence's inputs and what the chain rule reads besides the raw inputs.
struct KdaTransformed {
  KdaInputs in;           // raw tensors where no transform applies; CUDA's transformed g is f32
  Tensor q_rstd, k_rstd;  // [B, T, H] (f32, f64 for f64 inputs) when transforms.qk_l2norm
};

// Checks a_log / dt_bias against the contract of kernels/kda.h (and that they come only with
// transforms.gate), and the gate's lower bound.
Status ValidateKdaTransformInputs(const KdaProblem& p, const KdaInputs& raw,
                                  const KdaInputTransforms& t);

StatusOr<KdaTransformed> ApplyKdaInputTransforms(const KdaProblem& p, const KdaInputs& raw,
                                                 const KdaInputTransforms& t);

// `grads` holds the gradients w.r.t. x.in (from the recurrence's backward); on return they are
// w.r.t. `raw` (dq, dk, dg, dbeta in the raw inputs' dtypes), with da_log / ddt_bias added when
// transforms.gate and raw.a_log / raw.dt_bias are defined.
Status ChainKdaInputTransforms(const KdaProblem& p, const KdaInputs& raw, const KdaTransformed& x,
                               const KdaInputTransforms& t, KdaGrads* grads);

}  // namespace orrery::kernels
