// Token sampling for rollouts: temperature and nucleus (top-p), plus the behaviour log-probability
// the learner's importance weights need.
//
// The behaviour policy μ is softmax(z / temperature) over the whole vocabulary: the learner
// evaluates π_prox and π_θ on logits divided by the same temperature, so the ratios compare like
// with like. Top-p only restricts which tokens can be drawn (the usual practice of AReaL, verl and
// slime); the recorded log-probability is that of the temperature-scaled distribution. With
// temperature 0 the draw is greedy and the recorded log-probability uses temperature 1.
#pragma once

#include <cstdint>

#include "core/philox.h"
#include "core/status.h"

namespace orrery::rollout {

struct SamplingOptions {
  double temperature = 1.0;  // >= 0; 0: greedy (lowest id on ties)
  double top_p = 1.0;        // in (0, 1]
};

Status ValidateSamplingOptions(const SamplingOptions& options);

struct SampledToken {
  int32_t id = 0;
  float logprob = 0;  // log softmax(z / T)[id]
};

// Draws from `vocab` logits with one uniform number from `rng` (drawn even when greedy, so an
// episode's stream stays aligned whatever its options).
SampledToken SampleToken(const float* logits, int64_t vocab, const SamplingOptions& options,
                         PhiloxGenerator& rng);
// The same draw with the uniform number u in [0, 1) given: SampleToken is this with
// rng.Uniform(). The device sampler (kernels/token_sampling.h) implements this rule.
SampledToken SampleTokenWithUniform(const float* logits, int64_t vocab,
                                    const SamplingOptions& options, float u);

}  // namespace orrery::rollout
