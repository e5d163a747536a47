#include "actors/replay/item_selector.h"

#include "actors/replay/heap_selector.h"
#include "actors/replay/order_selector.h"
#include "actors/replay/prioritized_selector.h"
#include "actors/replay/uniform_selector.h"

namespace orrery::replay {

std::string_view SelectorKindName(SelectorKind kind) {
  switch (kind) {
    case SelectorKind::kUniform:
      return "uniform";
    case SelectorKind::kPrioritized:
      return "prioritized";
    case SelectorKind::kFifo:
      return "fifo";
    case SelectorKind::kLifo:
      return "lifo";
    case SelectorKind::kMinHeap:
      return "min_heap";
    case SelectorKind::kMaxHeap:
      return "max_heap";
  }
  return "unknown";
}

StatusOr<SelectorKind> ParseSelectorKind(std::string_view name) {
  for (SelectorKind k : {SelectorKind::kUniform, SelectorKind::kPrioritized, SelectorKind::kFifo,
                         SelectorKind::kLifo, SelectorKind::kMinHeap, SelectorKind::kMaxHeap}) {
    if (SelectorKindName(k) == name) return k;
  }
  return InvalidArgumentError("unknown selector '" + std::string(name) +
                              "' (expected uniform, prioritized, fifo, lifo, min_heap, max_heap)");
}

std::unique_ptr<ItemSelector> MakeSelector(const SelectorOptions& options) {
  switch (options.kind) {
    case SelectorKind::kUniform:
      return std::make_unique<UniformSelector>();
    case SelectorKind::kPrioritized:
      return std::make_unique<PrioritizedSelector>(options.priority_exponent);
    case SelectorKind::kFifo:
      return std::make_unique<OrderSelector>(false);
    case SelectorKind::kLifo:
      return std::make_unique<OrderSelector>(true);
    case SelectorKind::kMinHeap:
      return std::make_unique<HeapSelector>(false);
    case SelectorKind::kMaxHeap:
      return std::make_unique<HeapSelector>(true);
  }
  return nullptr;
}

double UniformDouble(PhiloxGenerator& rng) {
  return static_cast<double>(rng.NextU64() >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace orrery::replay
