// MinHeap and MaxHeap: select the item of lowest (highest) priority; among equal priorities the
// one inserted or updated longest ago (smallest tiebreak). O(log n) per operation.
#pragma once

#include <set>
#include <tuple>
#include <unordered_map>

#include "actors/replay/item_selector.h"

namespace orrery::replay {

class HeapSelector final : public ItemSelector {
 public:
  explicit HeapSelector(bool max_first) : max_first_(max_first) {}
  Status Insert(uint64_t key, double priority, uint64_t tiebreak) override;
  Status Update(uint64_t key, double priority, uint64_t tiebreak) override;
  Status Delete(uint64_t key) override;
  StatusOr<Selection> Select(PhiloxGenerator& rng) const override;
  size_t size() const override { return entries_.size(); }
  std::string Describe() const override { return max_first_ ? "max_heap" : "min_heap"; }

 private:
  // (priority, or -priority for a max heap; tiebreak; key): the first element is selected.
  using Entry = std::tuple<double, uint64_t, uint64_t>;
  Entry MakeEntry(uint64_t key, double priority, uint64_t tiebreak) const;
  bool max_first_;
  std::set<Entry> order_;
  std::unordered_map<uint64_t, Entry> entries_;
};

}  // namespace orrery::replay
