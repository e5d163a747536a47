// CPU reference implementations of the KDA op (f32 and f64), behind kernels/kda.h.
//
// Internal to kernels/: inputs are already validated (kernels/kda_problem.h). Work is split over
// (sequence, head) pairs on core's default thread pool.
#pragma once

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/kda.h"
#include "kernels/kda_problem.h"

namespace orrery::kernels::cpu {

// Dispatch on p.algorithm; allocates out->o (and out->final_state when asked).
Status KdaForwardCpu(const KdaProblem& p, const KdaInputs& in, bool output_final_state,
                     KdaOutputs* out);
Status KdaBackwardCpu(const KdaProblem& p, const KdaInputs& in, const Tensor& d_o,
                      const Tensor& d_final_state, KdaGrads* grads);
Status KdaDecodeStepCpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                        const Tensor& beta, float scale, Tensor* state, Tensor* o);

// The two algorithms; `final_state` / `d_final_state` / `grads->dinitial_state` may be
// undefined. Outputs are preallocated by the dispatcher.
Status KdaRecurrentForwardCpu(const KdaProblem& p, const KdaInputs& in, Tensor* o,
                              Tensor* final_state);
Status KdaRecurrentBackwardCpu(const KdaProblem& p, const KdaInputs& in, const Tensor& d_o,
                               const Tensor& d_final_state, KdaGrads* grads);
Status KdaChunkedForwardCpu(const KdaProblem& p, const KdaInputs& in, Tensor* o,
                            Tensor* final_state);
Status KdaChunkedBackwardCpu(const KdaProblem& p, const KdaInputs& in, const Tensor& d_o,
                             const Tensor& d_final_state, KdaGrads* grads);

}  // namespace orrery::kernels::cpu
