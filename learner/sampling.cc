#include "learner/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace orrery {

int32_t SampleToken(const float* logits, int64_t vocab, const SamplingOptions& options,
                    PhiloxGenerator& rng) {
  if (options.temperature <= 0) {
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  }
  const float mx = *std::max_element(logits, logits + vocab);
  std::vector<double> p(vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    p[i] = std::exp((static_cast<double>(logits[i]) - mx) / options.temperature);
    sum += p[i];
  }
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  // The nucleus: the most likely tokens until their mass reaches top_p (at least one).
  double kept = 0;
  size_t n = 0;
  while (n < order.size() && (n == 0 || kept < options.top_p * sum)) kept += p[order[n++]];
  double u = static_cast<double>(rng.Uniform()) * kept;
  for (size_t i = 0; i < n; ++i) {
    u -= p[order[i]];
    if (u <= 0) return order[i];
  }
  return order[n - 1];
}

}  // namespace orrery
