// Prioritized: item i is selected with probability priority_i^exponent / sum_j priority_j^exponent
// (Schaul et al.'s prioritized replay, as in Reverb), in O(log n) through a sum tree. When every
// priority is zero the selection is uniform.
#pragma once

#include "actors/replay/item_selector.h"
#include "actors/replay/sum_tree.h"

namespace orrery::replay {

class PrioritizedSelector final : public ItemSelector {
 public:
  explicit PrioritizedSelector(double exponent) : exponent_(exponent) {}
  Status Insert(uint64_t key, double priority, uint64_t tiebreak) override;
  Status Update(uint64_t key, double priority, uint64_t tiebreak) override;
  Status Delete(uint64_t key) override;
  StatusOr<Selection> Select(PhiloxGenerator& rng) const override;
  size_t size() const override { return weights_.size(); }
  std::string Describe() const override;

 private:
  StatusOr<double> Weight(double priority) const;
  double exponent_;
  SumTree weights_;  // priority^exponent
  SumTree counts_;   // every weight 1: the uniform fallback
};

}  // namespace orrery::replay
