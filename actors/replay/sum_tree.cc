#include "actors/replay/sum_tree.h"

#include <algorithm>
#include <string>

namespace orrery::replay {

void SumTree::Rebuild(size_t leaves) {
  std::vector<double> nodes(2 * leaves, 0.0);
  std::vector<uint64_t> keys(leaves, 0);
  std::vector<bool> live(leaves, false);
  size_t next = 0;
  for (size_t s = 0; s < next_slot_; ++s) {
    if (!live_[s]) continue;
    nodes[leaves + next] = nodes_[leaves_ + s];
    keys[next] = key_of_slot_[s];
    live[next] = true;
    slot_of_[key_of_slot_[s]] = next;
    ++next;
  }
  for (size_t i = leaves - 1; i >= 1; --i) nodes[i] = nodes[2 * i] + nodes[2 * i + 1];
  leaves_ = leaves;
  next_slot_ = next;
  nodes_ = std::move(nodes);
  key_of_slot_ = std::move(keys);
  live_ = std::move(live);
}

void SumTree::SetSlot(size_t slot, double weight) {
  size_t i = leaves_ + slot;
  nodes_[i] = weight;
  for (i /= 2; i >= 1; i /= 2) nodes_[i] = nodes_[2 * i] + nodes_[2 * i + 1];
}

Status SumTree::Insert(uint64_t key, double weight) {
  if (!(weight >= 0)) return InvalidArgumentError("sum tree: weight must be >= 0");
  if (slot_of_.count(key)) return AlreadyExistsError("sum tree: key " + std::to_string(key));
  if (next_slot_ > 0 && key <= key_of_slot_[next_slot_ - 1]) {
    return InvalidArgumentError("sum tree: keys must increase");
  }
  if (next_slot_ == leaves_) {
    // Full: compact in place when at least half are holes, else double.
    const size_t live = slot_of_.size();
    size_t leaves = std::max<size_t>(16, leaves_);
    while (leaves < 2 * (live + 1)) leaves *= 2;
    Rebuild(leaves);
  }
  const size_t slot = next_slot_++;
  key_of_slot_[slot] = key;
  live_[slot] = true;
  slot_of_[key] = slot;
  SetSlot(slot, weight);
  return Status::OK();
}

Status SumTree::Set(uint64_t key, double weight) {
  if (!(weight >= 0)) return InvalidArgumentError("sum tree: weight must be >= 0");
  auto it = slot_of_.find(key);
  if (it == slot_of_.end()) return NotFoundError("sum tree: key " + std::to_string(key));
  SetSlot(it->second, weight);
  return Status::OK();
}

Status SumTree::Erase(uint64_t key) {
  auto it = slot_of_.find(key);
  if (it == slot_of_.end()) return NotFoundError("sum tree: key " + std::to_string(key));
  SetSlot(it->second, 0.0);
  live_[it->second] = false;
  slot_of_.erase(it);
  return Status::OK();
}

StatusOr<double> SumTree::Get(uint64_t key) const {
  auto it = slot_of_.find(key);
  if (it == slot_of_.end()) return NotFoundError("sum tree: key " + std::to_string(key));
  return nodes_[leaves_ + it->second];
}

uint64_t SumTree::Find(double u) const {
  size_t i = 1;
  while (i < leaves_) {
    const double left = nodes_[2 * i];
    // Rounding can leave u >= left while the right subtree is empty: go where the weight is.
    if ((u < left && left > 0) || nodes_[2 * i + 1] <= 0) {
      i = 2 * i;
    } else {
      u -= left;
      i = 2 * i + 1;
    }
  }
  return key_of_slot_[i - leaves_];
}

}  // namespace orrery::replay
