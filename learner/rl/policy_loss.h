// The RL policy loss of spec/rl.md §2: decoupled PPO (AReaL) with truncated or masked importance
// sampling (TIS / MIS) against the behaviour policy, token-mean over the loss mask, optional
// entropy bonus and k3 KL to a reference policy.
//
// Per token t (a row of logits predicting targets[t]):
//   log π_θ(t)   = z_t[y_t] - logsumexp(z_t)                    (differentiated)
//   r_t          = exp(log π_θ(t) - log π_prox(t))              (PPO ratio, proximal anchor)
//   ρ            = π_prox / μ at the configured level:           (behaviour weight, a constant)
//                  token:     exp(log π_prox(t) - log μ(t))
//                  sequence:  exp(Σ_{s in seq, m_s=1} (log π_prox(s) - log μ(s)))
//                  geometric: exp(mean of the same over the sequence's masked tokens)
//   w_t          = truncate: min(ρ, C)      mask: 1 if 1/C <= ρ <= C else 0      none: 1
//   s_t          = min(r_t A_t, clip(r_t, 1 - ε_low, 1 + ε_high) A_t)
//   loss_sum     = Σ_t m_t [ -w_t s_t - β H_t + κ k3_t ]
//   k3_t         = exp(ref_t - log π_θ(t)) - (ref_t - log π_θ(t)) - 1
// The caller divides by the total number of masked tokens of the optimizer step (over every
// micro-batch and rank: DAPO token-mean) by passing grad_scale = 1 / total; the returned sums are
// not scaled, so ranks can all-reduce them before dividing.
//
// With correction = truncate, level = token and C = w_max this is exactly AReaL's decoupled PPO
// (w_t = min(π_prox/μ, w_max)), the default. When a trajectory is fresh, π_prox = μ and w_t = 1.
// Weights, ratios and statistics are computed in double whatever the logits' dtype.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::rl {

enum class IsCorrection { kNone, kTruncate, kMask };
enum class IsLevel { kToken, kSequence, kGeometric };

StatusOr<IsCorrection> ParseIsCorrection(const std::string& name);  // none | truncate | mask
StatusOr<IsLevel> ParseIsLevel(const std::string& name);            // token | sequence | geometric

struct PolicyLossOptions {
  double clip_low = 0.2;    // ε_low
  double clip_high = 0.28;  // ε_high (DAPO clip-higher)
  IsCorrection correction = IsCorrection::kTruncate;
  IsLevel level = IsLevel::kToken;
  double is_cap = 5.0;        // C (w_max); > 1
  double entropy_coef = 0.0;  // β
  double kl_coef = 0.0;       // κ; needs PolicyLossInput::ref_logprobs
};

Status ValidatePolicyLossOptions(const PolicyLossOptions& options);

// Per-token inputs, all of length N = logits.dim(0). Tokens of one trajectory are contiguous and
// share a sequence id (only the sequence and geometric levels use it).
struct PolicyLossInput {
  std::vector<int32_t> targets;           // y_t; ignored where mask is 0
  std::vector<uint8_t> mask;              // m_t
  std::vector<float> behaviour_logprobs;  // log μ(t), recorded by the rollout actor
  std::vector<float> proximal_logprobs;   // log π_prox(t), recomputed by the learner
  std::vector<float> advantages;          // A_t (the trajectory's advantage on each token)
  std::vector<int32_t> sequence_ids;      // non-decreasing
  std::vector<float> ref_logprobs;        // empty unless kl_coef > 0
};

// Sums over masked tokens (divide by `tokens` for means); additive over micro-batches and ranks.
struct PolicyLossStats {
  double loss_sum = 0;
  double tokens = 0;            // Σ m_t
  double clipped = 0;           // tokens whose PPO clip was active (zero gradient)
  double is_weight_sum = 0;     // Σ w_t
  double is_weight_sq_sum = 0;  // Σ w_t²
  double is_masked = 0;         // tokens MIS dropped (w_t = 0)
  double entropy_sum = 0;       // Σ H_t
  double ratio_sum = 0;         // Σ r_t
  double approx_kl_sum = 0;     // Σ (r_t - 1) - log r_t  (π_prox ‖ π_θ, k3)
  double ref_kl_sum = 0;        // Σ k3_t (when kl_coef > 0)

  void Add(const PolicyLossStats& other);
  double clip_fraction() const { return tokens > 0 ? clipped / tokens : 0; }
  double is_weight_mean() const { return tokens > 0 ? is_weight_sum / tokens : 0; }
  double is_weight_std() const;
  // Kish effective sample size of the weights as a fraction of the tokens: (Σw)² / (n Σw²).
  double is_weight_ess() const;
  double entropy_mean() const { return tokens > 0 ? entropy_sum / tokens : 0; }
};

// loss_sum and statistics of the batch; when dlogits is non-null it receives an [N, V] tensor of
// the logits' dtype holding grad_scale * d(loss_sum)/d(logits) (zero rows where mask is 0).
// logits: [N, V] f32 or f64 on the CPU.
StatusOr<PolicyLossStats> PolicyLoss(const PolicyLossOptions& options, const Tensor& logits,
                                     const PolicyLossInput& input, double grad_scale,
                                     Tensor* dlogits);

// The behaviour weight w_t of every row (0 where mask is 0) at the configured correction and
// level, and their statistics over the masked rows added into *stats (is_weight_sum,
// is_weight_sq_sum, is_masked; may be null). They depend on π_prox and μ only, not on θ: the
// fused GPU loss (kernels/lm_head_policy_loss.h) takes them as an input.
StatusOr<std::vector<double>> BehaviourWeights(const PolicyLossOptions& options,
                                               const PolicyLossInput& input,
                                               PolicyLossStats* stats);

// log softmax(z_t)[y_t] per row, and the entropy of each row when `entropy` is non-null: what the
// learner records as π_prox and what tests use as an oracle. Rows with y_t < 0 give 0.
StatusOr<std::vector<float>> TokenLogprobs(const Tensor& logits,
                                           const std::vector<int32_t>& targets,
                                           std::vector<float>* entropy = nullptr);

}  // namespace orrery::rl
