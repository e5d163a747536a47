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

// The tensor-core forward (kda_forward_tc.cu): 64-token chunks prepared all at once on bf16 MMAs,
// then a state pass per (segment, head, 64-wide V slice). KdaForwardCuda takes it whenever
// KdaTcSupported; the SIMT kernel above serves f32 inputs (reference-grade fp32 arithmetic) and
// other K, V.
struct KdaTcTuning {
  // Segments each sequence's chunks are split into for the state pass (spec §2.5); 0 = chosen
  // from the number of blocks the unsplit pass would have against the multiprocessor count.
  int segments_per_sequence = 0;
  // Benchmarks only: run the chunk preparation (stage 1) and skip the state pass, to time the
  // stages apart (o and final_state are left unwritten).
  bool prep_only = false;
};

// bf16 q, k, v, beta (g f32 or bf16), K and V each 64 or 128.
bool KdaTcSupported(const KdaProblem& p, const KdaInputs& in);

// out->o must be allocated ([B, T, H, V] bf16); out->final_state may be undefined. Waits for
// the kernels before returning (its scratch is freed on return).
Status LaunchKdaForwardTc(const KdaProblem& p, const KdaInputs& in, const KdaTcTuning& tuning,
                          KdaOutputs* out);

}  // namespace orrery::kernels::cuda
