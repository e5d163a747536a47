#include "actors/replay/uniform_selector.h"

namespace orrery::replay {

Status UniformSelector::Insert(uint64_t key, double, uint64_t) { return tree_.Insert(key, 1.0); }

Status UniformSelector::Update(uint64_t key, double, uint64_t) { return tree_.Get(key).status(); }

Status UniformSelector::Delete(uint64_t key) { return tree_.Erase(key); }

StatusOr<Selection> UniformSelector::Select(PhiloxGenerator& rng) const {
  if (tree_.size() == 0) return FailedPreconditionError("uniform selector: no items");
  const uint64_t k = rng.UniformInt(tree_.size());
  return Selection{tree_.Find(static_cast<double>(k) + 0.5), 1.0 / static_cast<double>(size())};
}

}  // namespace orrery::replay
