#include "learner/rl/advantage.h"

#include <cmath>

namespace orrery::rl {

StatusOr<AdvantageKind> ParseAdvantageKind(const std::string& name) {
  if (name == "grpo") return AdvantageKind::kGrpo;
  if (name == "dr_grpo") return AdvantageKind::kDrGrpo;
  if (name == "rloo") return AdvantageKind::kRloo;
  return InvalidArgumentError("unknown advantage estimator '" + name +
                              "' (expected grpo, dr_grpo or rloo)");
}

std::vector<double> GroupAdvantages(AdvantageKind kind, const std::vector<double>& rewards) {
  const size_t n = rewards.size();
  std::vector<double> out(n, 0.0);
  if (n < 2) return out;
  double sum = 0;
  for (double r : rewards) sum += r;
  const double mean = sum / static_cast<double>(n);
  bool all_equal = true;
  for (double r : rewards) all_equal = all_equal && r == rewards[0];
  if (all_equal) return out;
  switch (kind) {
    case AdvantageKind::kGrpo: {
      double var = 0;
      for (double r : rewards) var += (r - mean) * (r - mean);
      const double std = std::sqrt(var / static_cast<double>(n));
      for (size_t i = 0; i < n; ++i) out[i] = (rewards[i] - mean) / (std + 1e-6);
      break;
    }
    case AdvantageKind::kDrGrpo:
      for (size_t i = 0; i < n; ++i) out[i] = rewards[i] - mean;
      break;
    case AdvantageKind::kRloo:
      for (size_t i = 0; i < n; ++i) {
        out[i] = rewards[i] - (sum - rewards[i]) / static_cast<double>(n - 1);
      }
      break;
  }
  return out;
}

}  // namespace orrery::rl
