// CUDA implementations of the KDA op (sm_90a), behind kernels/kda.h.
//
// Internal to kernels/: inputs are validated by kernels/kda.cc. q, k, v, beta are f32 or bf16,
// g is f32 or their dtype; states are f32. Work runs on the default stream and the calls return
// after the kernels are queued (errors of the launch itself are reported).
#pragma once

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/kda.h"
#include "kernels/kda_problem.h"

namespace orrery::kernels::cuda {

Status KdaForwardCuda(const KdaProblem& p, const KdaInputs& in, bool output_final_state,
                      KdaOutputs* out);
Status KdaBackwardCuda(const KdaProblem& p, const KdaInputs& in, const Tensor& d_o,
                       const Tensor& d_final_state, KdaGrads* grads);
Status KdaDecodeStepCuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                         const Tensor& beta, float scale, Tensor* state, Tensor* o);

}  // namespace orrery::kernels::cuda
