// Fifo and Lifo: select the oldest or the newest item (by key, i.e. insertion order).
#pragma once

#include <set>

#include "actors/replay/item_selector.h"

namespace orrery::replay {

class OrderSelector final : public ItemSelector {
 public:
  explicit OrderSelector(bool newest_first) : newest_first_(newest_first) {}
  Status Insert(uint64_t key, double priority, uint64_t tiebreak) override;
  Status Update(uint64_t key, double priority, uint64_t tiebreak) override;
  Status Delete(uint64_t key) override;
  StatusOr<Selection> Select(PhiloxGenerator& rng) const override;
  size_t size() const override { return keys_.size(); }
  std::string Describe() const override { return newest_first_ ? "lifo" : "fifo"; }

 private:
  bool newest_first_;
  std::set<uint64_t> keys_;
};

}  // namespace orrery::replay
