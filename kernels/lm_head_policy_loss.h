// The LM head fused with the RL policy loss (learner/rl/policy_loss.h, spec/rl.md §2) and its
// backward, chunked over tokens like LmHeadCrossEntropy (kernels/lm_head_loss.h): per chunk of
// `chunk_rows` rows the logits [rows, V] are formed (f32 on CUDA), divided by the rollout's
// temperature, and per row turned into log π_θ(y) = z[y] - logsumexp(z) and the entropy H, then
// the token's decoupled-PPO terms (kernels/policy_token_terms.h) and, in place of the logits,
// d loss / d logits, which two products take back to dx and dW. The logits of all N tokens never
// exist at once.
//
//   z_n = (x_n W^T) / T
//   loss_sum = Σ_n m_n [ -w_n min(r_n A_n, clip(r_n) A_n) - β H_n + κ k3_n ],  r_n = π_θ / π_prox
//   dz_n = s m_n [ dlogp_n (onehot(y_n) - p_n) + β p_n (log p_n + H_n) ] / T,  s = grad_scale
//   dx = dz W (overwritten),  dW += dz^T x
//
// Why its own op rather than a mode of LmHeadCrossEntropy: the per-row work is another function
// with five per-token inputs and seven sums out, and the forward-only log-prob pass (π_prox) is
// part of the same concept; the chunking is the same and so are the dtypes and error contract.
//
// The behaviour weight w_n (π_prox/μ truncated or masked at the token, sequence or geometric
// level) is an input: it depends on whole sequences and not on θ, so the caller computes it on
// the host. Rows with mask 0 give log π 0, no sums and a zero gradient row.
//
// Dtypes: CPU (the twin): x, W, dx, dW f32 or f64, the row maths in f64. CUDA: x and W bf16 (dz
// rounded to bf16 for the products) or all f32; dx in x's dtype, dW f32; the softmax sums in f32,
// the token terms in f64. The per-row inputs are f32 [N] (targets i32 [N]) on x's device. A
// masked row whose target is outside [0, V) fails with OutOfRange (on CUDA: one flag read back per
// call, which also brings the sums back).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

struct LmHeadPolicyOptions {
  int64_t chunk_rows = 4096;  // tokens per chunk (> 0)
  double grad_scale = 1.0;
  double temperature = 1.0;  // T (> 0): the logits the rollout sampled from were divided by it
  double clip_low = 0.2;     // ε_low
  double clip_high = 0.28;   // ε_high
  double entropy_coef = 0;   // β
  double kl_coef = 0;        // κ (> 0 needs PolicyRows::ref)
};

// Per-token inputs, each [N] on x's device.
struct PolicyRows {
  Tensor targets;    // i32 y_n
  Tensor mask;       // f32 m_n, 0 or 1
  Tensor proximal;   // f32 log π_prox(n)
  Tensor weight;     // f32 w_n
  Tensor advantage;  // f32 A_n
  Tensor ref;        // f32 reference log-probabilities; undefined unless kl_coef > 0
};

// Sums over the rows with m_n = 1 (the θ-dependent part of learner/rl PolicyLossStats).
struct PolicyRowSums {
  double loss_sum = 0;
  double tokens = 0;
  double clipped = 0;        // rows whose clip branch was taken (zero gradient from the surrogate)
  double entropy_sum = 0;    // Σ H
  double ratio_sum = 0;      // Σ r
  double approx_kl_sum = 0;  // Σ (r - 1) - log r
  double ref_kl_sum = 0;     // Σ k3 (κ > 0)
};

// The loss sums; `logp` (f32 [N] on x's device, allocated when undefined; null: not returned)
// receives log π_θ per row. dx (allocated like x when undefined) and dw (required when non-null,
// accumulated) may be null to skip the backward.
Status LmHeadPolicyLoss(const Tensor& x, const Tensor& w, const PolicyRows& rows,
                        const LmHeadPolicyOptions& options, PolicyRowSums* sums, Tensor* logp,
                        Tensor* dx, Tensor* dw);

// The forward-only pass: log π(y_n) of the temperature-scaled logits (and the entropy when
// `entropy` is non-null), f32 [N] on x's device, for the rows with mask 1 (0 elsewhere). Only
// options.chunk_rows and options.temperature are read.
Status LmHeadTokenLogprobs(const Tensor& x, const Tensor& w, const Tensor& targets,
                           const Tensor& mask, const LmHeadPolicyOptions& options, Tensor* logp,
                           Tensor* entropy);

}  // namespace orrery::kernels
