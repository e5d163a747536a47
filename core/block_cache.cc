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

BlockCache::~BlockCache() {
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseCachedLocked();
  for (auto& [pool, blocks] : pool_cached_) {
    for (auto& [size, p] : blocks) free_(p);
  }
  pool_cached_.clear();
}

bool BlockCache::PoolActiveHere() const {
  return active_ != 0 && active_thread_ == std::this_thread::get_id();
}

void* BlockCache::Allocate(size_t bytes) {
  const size_t size = BlockSizeClass(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  const bool pooled = PoolActiveHere();
  std::multimap<size_t, void*>& source = pooled ? pool_cached_[active_] : cached_;
  void* p = nullptr;
  auto it = source.find(size);
  if (it != source.end()) {
    p = it->second;
    source.erase(it);
    stats_.bytes_cached -= size;
    ++stats_.cache_hits;
  } else {
    p = alloc_(size);
    if (p == nullptr) {  // out of memory: give the shared cache back and try once more
      ReleaseCachedLocked();
      p = alloc_(size);
    }
    if (p == nullptr) return nullptr;
    ++stats_.fresh_allocs;
    if (pooled) {
      owner_[p] = Owner{active_, size};
      stats_.bytes_in_pools += size;
    }
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
  stats_.bytes_in_use -= size;
  stats_.bytes_cached += size;
  auto own = owner_.find(ptr);
  if (own != owner_.end()) {
    if (live_pools_.count(own->second.pool)) {
      pool_cached_[own->second.pool].emplace(size, ptr);
      return;
    }
    owner_.erase(own);  // its pool was released: the block is shared again
  } else if (PoolActiveHere()) {
    owner_[ptr] = Owner{active_, size};  // freed during a capture: the graph may use it
    stats_.bytes_in_pools += size;
    pool_cached_[active_].emplace(size, ptr);
    return;
  }
  cached_.emplace(size, ptr);
}

void BlockCache::ReleaseCached() {
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseCachedLocked();
}

void BlockCache::ReleaseCachedLocked() {
  for (auto& [size, p] : cached_) {
    free_(p);
    stats_.bytes_cached -= size;
  }
  cached_.clear();
}

void BlockCache::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
}

BlockCache::Stats BlockCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

BlockCache::PoolId BlockCache::CreatePool() {
  std::lock_guard<std::mutex> lock(mu_);
  const PoolId id = next_pool_++;
  live_pools_.insert(id);
  pool_cached_[id];
  return id;
}

bool BlockCache::BeginPool(PoolId pool) {
  std::lock_guard<std::mutex> lock(mu_);
  if (active_ != 0 || !live_pools_.count(pool)) return false;
  active_ = pool;
  active_thread_ = std::this_thread::get_id();
  return true;
}

void BlockCache::EndPool() {
  std::lock_guard<std::mutex> lock(mu_);
  if (PoolActiveHere()) active_ = 0;
}

void BlockCache::ReleasePool(PoolId pool) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!live_pools_.erase(pool)) return;
  if (active_ == pool) active_ = 0;
  auto it = pool_cached_.find(pool);
  if (it != pool_cached_.end()) {
    for (auto& [size, p] : it->second) {
      owner_.erase(p);
      cached_.emplace(size, p);
      stats_.bytes_in_pools -= size;
    }
    pool_cached_.erase(it);
  }
  // Its live blocks stay in owner_ until they are freed, then go to the shared cache.
  for (const auto& [p, o] : owner_) {
    if (o.pool == pool) stats_.bytes_in_pools -= o.size;
  }
}

}  // namespace orrery
