#include "rollout/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace orrery::rollout {

Status ValidateSamplingOptions(const SamplingOptions& o) {
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) {
    return InvalidArgumentError("sampling: temperature must be >= 0, got " +
                                std::to_string(o.temperature));
  }
  if (!(o.top_p > 0 && o.top_p <= 1)) {
    return InvalidArgumentError("sampling: top_p must be in (0, 1], got " +
                                std::to_string(o.top_p));
  }
  return Status::OK();
}

SampledToken SampleToken(const float* z, int64_t vocab, const SamplingOptions& o,
                         PhiloxGenerator& rng) {
  return SampleTokenWithUniform(z, vocab, o, rng.Uniform());
}

SampledToken SampleTokenWithUniform(const float* z, int64_t vocab, const SamplingOptions& o,
                                    float u) {
  const double t = o.temperature > 0 ? o.temperature : 1.0;
  double mx = z[0];
  int32_t argmax = 0;
  for (int64_t j = 1; j < vocab; ++j) {
    if (z[j] > mx) {
      mx = z[j];
      argmax = static_cast<int32_t>(j);
    }
  }
  std::vector<double> p(vocab);
  double sum = 0;
  for (int64_t j = 0; j < vocab; ++j) {
    p[j] = std::exp((z[j] - mx) / t);
    sum += p[j];
  }
  const double log_sum = std::log(sum);
  auto logprob = [&](int32_t id) { return static_cast<float>((z[id] - mx) / t - log_sum); };
  if (o.temperature == 0) return {argmax, logprob(argmax)};

  // Candidates in decreasing probability (ties by id), cut at the nucleus.
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  int64_t keep = vocab;
  if (o.top_p < 1.0) {
    std::sort(order.begin(), order.end(),
              [&](int32_t a, int32_t b) { return p[a] != p[b] ? p[a] > p[b] : a < b; });
    double acc = 0;
    for (keep = 0; keep < vocab;) {
      acc += p[order[keep]] / sum;
      ++keep;
      if (acc >= o.top_p) break;
    }
  }
  double kept_sum = 0;
  for (int64_t i = 0; i < keep; ++i) kept_sum += p[order[i]];
  const double target = static_cast<double>(u) * kept_sum;
  double acc = 0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += p[order[i]];
    if (acc >= target) return {order[i], logprob(order[i])};
  }
  return {order[keep - 1], logprob(order[keep - 1])};
}

}  // namespace orrery::rollout
