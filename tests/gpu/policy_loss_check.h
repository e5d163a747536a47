// Random cases for the fused LM head + policy loss (kernels/lm_head_policy_loss.h), shared by its
// unit test against the host PolicyLoss over explicit [N, V] logits
// (tests/unit/learner/rl_fused_loss_test.cc) and the GPU test of its CUDA kernel against the CPU
// twin (tests/gpu/rl_gpu_test.cc). π_prox is the current policy's log-probability plus noise, so
// ratios spread over [0.5, 2] and the clip acts on both sides; μ is π_prox plus more noise, so
// behaviour weights exceed the cap (truncated) or leave [1/C, C] (masked); advantages have both
// signs; every fifth row is outside the loss mask; rows form sequences of 1 to 40 tokens.
#pragma once

#include <cmath>
#include <vector>

#include "core/philox.h"
#include "core/tensor.h"
#include "kernels/lm_head_policy_loss.h"
#include "learner/rl/policy_loss.h"
#include "tests/unit/kernels/kda_test_util.h"

namespace orrery::rl::policy_check {

struct Case {
  Tensor x, w;  // f64 [N, d], [V, d]
  PolicyLossInput in;
  PolicyLossOptions options;
  double temperature = 0.7;
  double grad_scale = 1.0 / 300;
};

inline Case RandomCase(int64_t n, int64_t d, int64_t v, uint64_t seed, PolicyLossOptions options) {
  Case c;
  c.options = options;
  PhiloxGenerator rng(seed, 0);
  c.x = kernels::testing::RandomNormal({n, d}, DType::kF64, rng);
  c.w = kernels::testing::RandomNormal({v, d}, DType::kF64, rng, 0.4);
  int32_t seq = 0;
  int64_t left = 1 + static_cast<int64_t>(rng.UniformInt(40));
  for (int64_t i = 0; i < n; ++i) {
    if (left-- == 0) {
      ++seq;
      left = static_cast<int64_t>(rng.UniformInt(40));
    }
    const bool masked = i % 5 != 2;
    c.in.targets.push_back(masked || rng.UniformInt(2) == 0
                               ? static_cast<int32_t>(rng.UniformInt(static_cast<uint64_t>(v)))
                               : -1);
    c.in.mask.push_back(masked ? 1 : 0);
    c.in.advantages.push_back(static_cast<float>(rng.Normal()));
    c.in.sequence_ids.push_back(seq);
    c.in.ref_logprobs.push_back(static_cast<float>(-2.0 - std::abs(rng.Normal())));
  }
  // π_prox and μ around the current policy's log-probabilities.
  Tensor logits = Tensor::Empty({n, v}, DType::kF64);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < v; ++j) {
      double z = 0;
      for (int64_t k = 0; k < d; ++k)
        z += c.x.data<double>()[i * d + k] * c.w.data<double>()[j * d + k];
      logits.data<double>()[i * v + j] = z / c.temperature;
    }
  }
  std::vector<float> logp = TokenLogprobs(logits, c.in.targets).value();
  for (int64_t i = 0; i < n; ++i) {
    const float prox = logp[i] + 0.35f * rng.Normal();
    c.in.proximal_logprobs.push_back(prox);
    c.in.behaviour_logprobs.push_back(prox + 0.9f * rng.Normal());
  }
  return c;
}

// The fused op's per-row inputs for `c` on `device` (the behaviour weights from the host).
inline kernels::PolicyRows Rows(const Case& c, Device device) {
  const int64_t n = static_cast<int64_t>(c.in.mask.size());
  std::vector<int32_t> targets(c.in.targets);
  std::vector<float> mask(n), weight(n);
  const std::vector<double> w = BehaviourWeights(c.options, c.in, nullptr).value();
  for (int64_t i = 0; i < n; ++i) {
    mask[i] = c.in.mask[i];
    weight[i] = static_cast<float>(w[i]);
    if (targets[i] < 0) targets[i] = 0;
  }
  kernels::PolicyRows r;
  r.targets = Tensor::FromVector<int32_t>({n}, targets).To(device).value();
  r.mask = Tensor::FromVector<float>({n}, mask).To(device).value();
  r.proximal = Tensor::FromVector<float>({n}, c.in.proximal_logprobs).To(device).value();
  r.weight = Tensor::FromVector<float>({n}, weight).To(device).value();
  r.advantage = Tensor::FromVector<float>({n}, c.in.advantages).To(device).value();
  if (c.options.kl_coef > 0) {
    r.ref = Tensor::FromVector<float>({n}, c.in.ref_logprobs).To(device).value();
  }
  return r;
}

inline kernels::LmHeadPolicyOptions OpOptions(const Case& c, int64_t chunk_rows) {
  kernels::LmHeadPolicyOptions o;
  o.chunk_rows = chunk_rows;
  o.grad_scale = c.grad_scale;
  o.temperature = c.temperature;
  o.clip_low = c.options.clip_low;
  o.clip_high = c.options.clip_high;
  o.entropy_coef = c.options.entropy_coef;
  o.kl_coef = c.options.kl_coef;
  return o;
}

// The option sets the tests sweep: the default (truncate, token), MIS at the token level with the
// entropy bonus, truncation at the geometric level with KL, MIS at the sequence level with both.
inline std::vector<PolicyLossOptions> OptionSweep() {
  std::vector<PolicyLossOptions> out(4);
  out[1].correction = IsCorrection::kMask;
  out[1].is_cap = 2.0;
  out[1].entropy_coef = 0.03;
  out[2].level = IsLevel::kGeometric;
  out[2].is_cap = 1.5;
  out[2].kl_coef = 0.1;
  out[3].correction = IsCorrection::kMask;
  out[3].level = IsLevel::kSequence;
  out[3].is_cap = 3.0;
  out[3].entropy_coef = 0.01;
  out[3].kl_coef = 0.05;
  return out;
}

}  // namespace orrery::rl::policy_check
