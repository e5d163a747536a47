// The per-token terms of the decoupled PPO loss (learner/rl/policy_loss.h) given the token's
// log π_θ and entropy, shared by the CPU twin and the CUDA kernel of the fused LM head + policy
// loss (kernels/lm_head_policy_loss.h) so both take the clip branch by the same comparison. The
// host PolicyLoss keeps its own copy of the formulas: it is the oracle both are tested against.
//
//   r = exp(logp - prox),  s = min(r A, clip(r, lo, hi) A)   (clipped: the clip branch is taken)
//   loss  = -w s - β H + κ k3,   k3 = exp(ref - logp) - (ref - logp) - 1   (κ > 0 only)
//   dlogp = d loss / d logp = (clipped ? 0 : -w A r) + κ (1 - exp(ref - logp))
// All in double, whatever the logits' dtype.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define ORRERY_POLICY_HD __host__ __device__ __forceinline__
#else
#define ORRERY_POLICY_HD inline
#endif

namespace orrery::kernels {

struct PolicyTokenCoefficients {
  double lo = 0.8, hi = 1.28;  // 1 - ε_low, 1 + ε_high
  double entropy_coef = 0;     // β
  double kl_coef = 0;          // κ
};

struct PolicyTokenTerms {
  double loss = 0, dlogp = 0;
  double ratio = 1, approx_kl = 0, ref_kl = 0;
  bool clipped = false;
};

ORRERY_POLICY_HD PolicyTokenTerms PolicyTerms(double logp, double entropy, double prox, double w,
                                              double a, double ref,
                                              const PolicyTokenCoefficients& c) {
  PolicyTokenTerms t;
  const double log_ratio = logp - prox;
  t.ratio = exp(log_ratio);
  const double unclipped = t.ratio * a;
  const double clipped = fmin(fmax(t.ratio, c.lo), c.hi) * a;
  t.clipped = clipped < unclipped;
  t.loss = -w * (t.clipped ? clipped : unclipped) - c.entropy_coef * entropy;
  t.dlogp = t.clipped ? 0.0 : -w * a * t.ratio;
  if (c.kl_coef > 0) {
    const double d = ref - logp;
    t.ref_kl = exp(d) - d - 1.0;
    t.loss += c.kl_coef * t.ref_kl;
    t.dlogp += c.kl_coef * (1.0 - exp(d));
  }
  t.approx_kl = (t.ratio - 1.0) - log_ratio;
  return t;
}

}  // namespace orrery::kernels
