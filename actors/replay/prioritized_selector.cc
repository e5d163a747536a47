#include "actors/replay/prioritized_selector.h"

#include <cmath>

namespace orrery::replay {

StatusOr<double> PrioritizedSelector::Weight(double priority) const {
  if (!(priority >= 0) || !std::isfinite(priority)) {
    return InvalidArgumentError("prioritized selector: priority must be finite and >= 0, got " +
                                std::to_string(priority));
  }
  const double w = std::pow(priority, exponent_);
  if (!std::isfinite(w)) {
    return InvalidArgumentError("prioritized selector: priority^exponent overflows");
  }
  return w;
}

Status PrioritizedSelector::Insert(uint64_t key, double priority, uint64_t) {
  ORRERY_ASSIGN_OR_RETURN(double w, Weight(priority));
  ORRERY_RETURN_IF_ERROR(weights_.Insert(key, w));
  return counts_.Insert(key, 1.0);
}

Status PrioritizedSelector::Update(uint64_t key, double priority, uint64_t) {
  ORRERY_ASSIGN_OR_RETURN(double w, Weight(priority));
  return weights_.Set(key, w);
}

Status PrioritizedSelector::Delete(uint64_t key) {
  ORRERY_RETURN_IF_ERROR(weights_.Erase(key));
  return counts_.Erase(key);
}

StatusOr<Selection> PrioritizedSelector::Select(PhiloxGenerator& rng) const {
  if (weights_.size() == 0) return FailedPreconditionError("prioritized selector: no items");
  const double total = weights_.total();
  if (!(total > 0)) {
    const uint64_t k = rng.UniformInt(counts_.size());
    return Selection{counts_.Find(static_cast<double>(k) + 0.5),
                     1.0 / static_cast<double>(counts_.size())};
  }
  const uint64_t key = weights_.Find(UniformDouble(rng) * total);
  ORRERY_ASSIGN_OR_RETURN(double w, weights_.Get(key));
  return Selection{key, w / total};
}

std::string PrioritizedSelector::Describe() const {
  return "prioritized(" + std::to_string(exponent_) + ")";
}

}  // namespace orrery::replay
