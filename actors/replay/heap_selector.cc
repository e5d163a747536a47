#include "actors/replay/heap_selector.h"

#include <cmath>
#include <string>

namespace orrery::replay {

HeapSelector::Entry HeapSelector::MakeEntry(uint64_t key, double priority,
                                            uint64_t tiebreak) const {
  return Entry{max_first_ ? -priority : priority, tiebreak, key};
}

Status HeapSelector::Insert(uint64_t key, double priority, uint64_t tiebreak) {
  if (std::isnan(priority)) return InvalidArgumentError(Describe() + " selector: NaN priority");
  if (entries_.count(key)) {
    return AlreadyExistsError(Describe() + " selector: key " + std::to_string(key));
  }
  Entry e = MakeEntry(key, priority, tiebreak);
  entries_.emplace(key, e);
  order_.insert(e);
  return Status::OK();
}

Status HeapSelector::Update(uint64_t key, double priority, uint64_t tiebreak) {
  if (std::isnan(priority)) return InvalidArgumentError(Describe() + " selector: NaN priority");
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    return NotFoundError(Describe() + " selector: key " + std::to_string(key));
  }
  order_.erase(it->second);
  it->second = MakeEntry(key, priority, tiebreak);
  order_.insert(it->second);
  return Status::OK();
}

Status HeapSelector::Delete(uint64_t key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    return NotFoundError(Describe() + " selector: key " + std::to_string(key));
  }
  order_.erase(it->second);
  entries_.erase(it);
  return Status::OK();
}

StatusOr<Selection> HeapSelector::Select(PhiloxGenerator&) const {
  if (order_.empty()) return FailedPreconditionError(Describe() + " selector: no items");
  return Selection{std::get<2>(*order_.begin()), 1.0};
}

}  // namespace orrery::replay
