#include "actors/replay/order_selector.h"

#include <string>

namespace orrery::replay {

Status OrderSelector::Insert(uint64_t key, double, uint64_t) {
  if (!keys_.empty() && key <= *keys_.rbegin()) {
    return InvalidArgumentError(Describe() + " selector: keys must increase");
  }
  keys_.insert(keys_.end(), key);
  return Status::OK();
}

Status OrderSelector::Update(uint64_t key, double, uint64_t) {
  if (!keys_.count(key)) return NotFoundError(Describe() + " selector: key " + std::to_string(key));
  return Status::OK();
}

Status OrderSelector::Delete(uint64_t key) {
  if (!keys_.erase(key)) {
    return NotFoundError(Describe() + " selector: key " + std::to_string(key));
  }
  return Status::OK();
}

StatusOr<Selection> OrderSelector::Select(PhiloxGenerator&) const {
  if (keys_.empty()) return FailedPreconditionError(Describe() + " selector: no items");
  return Selection{newest_first_ ? *keys_.rbegin() : *keys_.begin(), 1.0};
}

}  // namespace orrery::replay
