// The bookkeeping of a caching allocator, independent of where memory comes from.
//
// Freed blocks are kept by size class; a request is served by a cached block of exactly its
// class. The CUDA allocator wraps one BlockCache per device around cudaMalloc/cudaFree; keeping
// the policy here lets it be tested without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

namespace orrery {

// Rounds a request up to its size class: 512-byte multiples up to 1 MiB, then steps of an eighth
// of the enclosing power of two (at most 12.5% waste).
size_t BlockSizeClass(size_t bytes);

class BlockCache {
 public:
  struct Stats {
    size_t bytes_in_use = 0;
    size_t bytes_cached = 0;
    size_t peak_bytes_in_use = 0;
    int64_t fresh_allocs = 0;
    int64_t cache_hits = 0;
  };

  // `alloc` returns nullptr on failure; `free` returns memory to the underlying source.
  BlockCache(std::function<void*(size_t)> alloc, std::function<void(void*)> free);
  ~BlockCache();
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // Returns a block of at least `bytes`, or nullptr when the source is exhausted even after
  // releasing every cached block.
  void* Allocate(size_t bytes);
  // Takes back a block from Allocate(bytes) with the same `bytes`.
  void Free(void* ptr, size_t bytes);
  // Returns all cached blocks to the source.
  void ReleaseCached();
  Stats stats() const;
  // Restarts the peak at the bytes in use now (a benchmark's phases each report their own peak).
  void ResetPeak();

 private:
  void ReleaseCachedLocked();

  std::function<void*(size_t)> alloc_;
  std::function<void(void*)> free_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> cached_;  // size class -> free block
  Stats stats_;
};

}  // namespace orrery
