#include "core/block_cache.h"

#include <bit>

namespace orrery {

size_t BlockSizeClass(size_t bytes) {
  constexpr size_t kSmallStep = 512;
  constexpr size_t kSmallLimit = size_t{1} << 20;
  if (bytes == 0) return kSmallStep;
  if (bytes <= kSmallLimit) return (bytes + kSmallStep - 1) / kSmallStep * kSmallStep;
  const size_t top = std::bit_floor(bytes);  // bytes in [top, 2*top)
  const size_t step = top / 8;
  return (bytes + step - 1) / step * step;
}

BlockCache::BlockCache(std::function<void*(size_t)> alloc, std::function<void(void*)> free)
    : alloc_(std::move(alloc)), free_(std::move(free)) {}

BlockCache::~BlockCache() { ReleaseCached(); }

void* BlockCache::Allocate(size_t bytes) {
  const size_t size = BlockSizeClass(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* p = nullptr;
  auto it = cached_.find(size);
  if (it != cached_.end()) {
    p = it->second;
    cached_.erase(it);
    stats_.bytes_cached -= size;
    ++stats_.cache_hits;
  } else {
    p = alloc_(size);
    if (p == nullptr) {  // out of memory: give the cache back and try once more
      ReleaseCachedLocked();
      p = alloc_(size);
    }
    if (p == nullptr) return nullptr;
    ++stats_.fresh_allocs;
  }
  stats_.bytes_in_use += size;
  if (stats_.bytes_in_use > stats_.peak_bytes_in_use)
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  return p;
}

void BlockCache::Free(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  const size_t size = BlockSizeClass(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  cached_.emplace(size, ptr);
  stats_.bytes_in_use -= size;
  stats_.bytes_cached += size;
}

void BlockCache::ReleaseCached() {
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseCachedLocked();
}

void BlockCache::ReleaseCachedLocked() {
  for (auto& [size, p] : cached_) free_(p);
  cached_.clear();
  stats_.bytes_cached = 0;
}

void BlockCache::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
}

BlockCache::Stats BlockCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace orrery
