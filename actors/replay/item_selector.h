// ItemSelector: picks the next item of a table to sample (as its sampler) or to evict (as its
// remover), as in DeepMind Reverb. Implementations: Uniform, Prioritized (sum tree, exponent),
// Fifo, Lifo, MinHeap, MaxHeap.
//
// A selector's state is a pure function of the live items (key, priority, tiebreak): keys arrive
// in increasing order, and layouts are canonical, so a table rebuilt from storage after a crash
// selects exactly as before (given the same random stream).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/philox.h"
#include "core/status.h"

namespace orrery::replay {

struct Selection {
  uint64_t key = 0;
  double probability = 0;  // the chance this key had of being selected
};

class ItemSelector {
 public:
  virtual ~ItemSelector() = default;
  // `key` is larger than every key inserted before. `tiebreak` orders items of equal priority
  // (smaller first: the item inserted or updated longest ago).
  virtual Status Insert(uint64_t key, double priority, uint64_t tiebreak) = 0;
  virtual Status Update(uint64_t key, double priority, uint64_t tiebreak) = 0;
  virtual Status Delete(uint64_t key) = 0;
  // Selects one item; FailedPrecondition when empty. Only Uniform and Prioritized draw from `rng`.
  virtual StatusOr<Selection> Select(PhiloxGenerator& rng) const = 0;
  virtual size_t size() const = 0;
  // "uniform", "prioritized(0.6)", "fifo", ...
  virtual std::string Describe() const = 0;
};

enum class SelectorKind { kUniform, kPrioritized, kFifo, kLifo, kMinHeap, kMaxHeap };

struct SelectorOptions {
  SelectorKind kind = SelectorKind::kUniform;
  double priority_exponent = 1.0;  // Prioritized only: p(i) = priority_i^exponent / sum
};

// Names used in configs: uniform, prioritized, fifo, lifo, min_heap, max_heap.
std::string_view SelectorKindName(SelectorKind kind);
StatusOr<SelectorKind> ParseSelectorKind(std::string_view name);

std::unique_ptr<ItemSelector> MakeSelector(const SelectorOptions& options);

// A uniform double in [0, 1) with 53 random bits.
double UniformDouble(PhiloxGenerator& rng);

}  // namespace orrery::replay
