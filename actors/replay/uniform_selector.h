// Uniform: every live item is equally likely (probability 1/size).
#pragma once

#include "actors/replay/item_selector.h"
#include "actors/replay/sum_tree.h"

namespace orrery::replay {

class UniformSelector final : public ItemSelector {
 public:
  Status Insert(uint64_t key, double priority, uint64_t tiebreak) override;
  Status Update(uint64_t key, double priority, uint64_t tiebreak) override;
  Status Delete(uint64_t key) override;
  StatusOr<Selection> Select(PhiloxGenerator& rng) const override;
  size_t size() const override { return tree_.size(); }
  std::string Describe() const override { return "uniform"; }

 private:
  SumTree tree_;  // every weight 1: the k-th item in key order is found in O(log n)
};

}  // namespace orrery::replay
