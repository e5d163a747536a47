// SumTree: weighted selection over items keyed by increasing uint64 keys, in O(log n).
//
// Leaves are slots of a segment tree laid out in key order (slots are never reused; when the
// tree is full and at least half the slots are holes it is compacted). Every inner node is
// recomputed from its two children, never updated by deltas, so sums are an exact function of
// the leaves and carry no drift after millions of updates. Selection walks cumulative weights in
// key order, so it does not depend on where the holes are: with integer weights (uniform) it is
// exact, with real weights it is up to the rounding of the partial sums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace orrery::replay {

class SumTree {
 public:
  // `key` must be larger than every key inserted before; weight >= 0.
  Status Insert(uint64_t key, double weight);
  Status Set(uint64_t key, double weight);
  Status Erase(uint64_t key);
  StatusOr<double> Get(uint64_t key) const;
  double total() const { return nodes_.empty() ? 0.0 : nodes_[1]; }
  size_t size() const { return slot_of_.size(); }
  // The key whose cumulative range [prefix, prefix + weight) holds u, for u in [0, total()).
  // Never a zero-weight item when total() > 0. Requires total() > 0.
  uint64_t Find(double u) const;

 private:
  void SetSlot(size_t slot, double weight);
  void Rebuild(size_t leaves);  // compacts live slots to the front, in key order

  size_t leaves_ = 0;  // a power of two
  size_t next_slot_ = 0;
  std::vector<double> nodes_;          // 1-based heap layout; leaves at [leaves_, 2 leaves_)
  std::vector<uint64_t> key_of_slot_;  // per slot (meaningless for holes)
  std::vector<bool> live_;             // per slot
  std::unordered_map<uint64_t, size_t> slot_of_;
};

}  // namespace orrery::replay
