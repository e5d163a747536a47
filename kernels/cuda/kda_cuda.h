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

// Shared by the forward and the backward (kda_forward.cu, kda_backward.cu).

// K <= 128 and an f32 initial state; one clear line otherwise.
Status CheckCudaKdaSupported(const KdaProblem& p, const KdaInputs& in);

// What the backward's forward sweep keeps (device pointers, all null for a plain forward).
struct KdaForwardSweep {
  const int64_t* chunk_first = nullptr;  // [N + 1]: sequence n owns chunks [first[n], first[n+1])
  float* chunk_states = nullptr;  // [chunks, H, K, V]: the state at each 16-token chunk start
  float* vnew = nullptr;          // [rows, H, V]: the pseudo-values U - W S
};

// Queues the chunked forward kernel (16-token chunks) on the default stream. seq_start is the
// device copy of p.seq_start; out->o and out->final_state may be undefined (not written).
Status LaunchKdaForward(const KdaProblem& p, const KdaInputs& in, const int64_t* seq_start,
                        KdaOutputs* out, const KdaForwardSweep& sweep);

}  // namespace orrery::kernels::cuda
