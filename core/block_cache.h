// The bookkeeping of a caching allocator, independent of where memory comes from.
//
// Freed blocks are kept by size class; a request is served by a cached block of exactly its
// class. The CUDA allocator wraps one BlockCache per device around cudaMalloc/cudaFree; keeping
// the policy here lets it be tested without a GPU.
//
// Private pools (CUDA graphs, core/cuda_graph.h). A captured graph keeps the addresses of every
// buffer its kernels touched and writes them again at each replay, so that memory must never be
// handed to another tensor after the capture. While a pool is active on the thread that began
// it, that thread's allocations are served from the pool's own free blocks or fresh from the
// source (never from the shared cache), and every block that thread frees joins the pool,
// whatever its origin (a captured kernel may have used it). A block of a pool returns to that pool
// whenever it is freed, from any thread, and is handed out again only inside it. Several graphs
// may share one pool when they are replayed one at a time on one stream: a block one graph freed
// during its capture is scratch of that graph, which another capture may reuse as its own
// scratch; a block still held (a graph's output) is in nobody's free list. ReleasePool (once the
// pool's graphs are destroyed) turns its free blocks into shared cache, and its live blocks go to
// the shared cache when they are freed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

namespace orrery {

// Rounds a request up to its size class: 512-byte multiples up to 1 MiB, then steps of an eighth
// of the enclosing power of two (at most 12.5% waste).
size_t BlockSizeClass(size_t bytes);

class BlockCache {
 public:
  struct Stats {
    size_t bytes_in_use = 0;
    size_t bytes_cached = 0;  // free blocks, the private pools' included
    size_t peak_bytes_in_use = 0;
    int64_t fresh_allocs = 0;
    int64_t cache_hits = 0;
    size_t bytes_in_pools = 0;  // blocks owned by live private pools (in use or free)
  };
  using PoolId = uint64_t;  // 0: no pool

  // `alloc` returns nullptr on failure; `free` returns memory to the underlying source.
  BlockCache(std::function<void*(size_t)> alloc, std::function<void(void*)> free);
  ~BlockCache();
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // Returns a block of at least `bytes`, or nullptr when the source is exhausted even after
  // releasing every cached block of the shared cache.
  void* Allocate(size_t bytes);
  // Takes back a block from Allocate(bytes) with the same `bytes`.
  void Free(void* ptr, size_t bytes);
  // Returns all cached blocks of the shared cache to the source (the pools keep theirs).
  void ReleaseCached();
  Stats stats() const;
  // Restarts the peak at the bytes in use now (a benchmark's phases each report their own peak).
  void ResetPeak();

  // A new, empty private pool.
  PoolId CreatePool();
  // Makes `pool` active for the calling thread (one active pool per cache at a time); false when
  // another pool is active or `pool` is not a live pool.
  bool BeginPool(PoolId pool);
  // Ends the calling thread's active pool (no effect on other threads or without one).
  void EndPool();
  // Retires `pool` (see above); its id is never reused.
  void ReleasePool(PoolId pool);

 private:
  void ReleaseCachedLocked();
  bool PoolActiveHere() const;

  std::function<void*(size_t)> alloc_;
  std::function<void(void*)> free_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> cached_;  // size class -> free block (shared)
  Stats stats_;
  // Private pools: their free blocks, and the owner of every block a live pool holds.
  std::map<PoolId, std::multimap<size_t, void*>> pool_cached_;
  struct Owner {
    PoolId pool;
    size_t size;  // its size class
  };
  std::unordered_map<void*, Owner> owner_;
  std::set<PoolId> live_pools_;
  PoolId next_pool_ = 1;
  PoolId active_ = 0;
  std::thread::id active_thread_;
};

}  // namespace orrery
