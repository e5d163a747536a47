#include "core/block_cache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <set>
#include <thread>

namespace orrery {
namespace {

TEST(BlockSizeClassTest, Classes) {
  EXPECT_EQ(BlockSizeClass(0), 512u);
  EXPECT_EQ(BlockSizeClass(1), 512u);
  EXPECT_EQ(BlockSizeClass(513), 1024u);
  EXPECT_EQ(BlockSizeClass(1 << 20), 1u << 20);
  // Above 1 MiB: eighths of the enclosing power of two.
  EXPECT_EQ(BlockSizeClass((1 << 20) + 1), (1u << 20) + (1u << 17));
  for (size_t b = 1; b < (64u << 20); b = b * 3 + 7) {
    size_t c = BlockSizeClass(b);
    EXPECT_GE(c, b);
    if (b > (1u << 20)) {
      EXPECT_LE(static_cast<double>(c - b) / b, 0.125);
    }
  }
}

TEST(BlockCacheTest, ReusesFreedBlocksAndReleasesOnPressure) {
  int live = 0;
  int budget = 2;  // the "device" holds two blocks at most
  std::set<void*> freed_to_source;
  BlockCache cache(
      [&](size_t bytes) -> void* {
        if (live == budget) return nullptr;
        ++live;
        return std::malloc(bytes);
      },
      [&](void* p) {
        --live;
        freed_to_source.insert(p);
        std::free(p);
      });
  void* a = cache.Allocate(1000);
  ASSERT_NE(a, nullptr);
  cache.Free(a, 1000);
  void* b = cache.Allocate(900);  // same 1024-byte class: served from the cache
  EXPECT_EQ(a, b);
  EXPECT_EQ(cache.stats().cache_hits, 1);
  EXPECT_EQ(cache.stats().fresh_allocs, 1);
  cache.Free(b, 900);
  void* c = cache.Allocate(5000);  // another class: fresh (second block)
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(live, 2);
  // A third class finds the source full; the cache gives back the free 1024 block and retries.
  void* d = cache.Allocate(100000);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(freed_to_source.size(), 1u);
  EXPECT_EQ(cache.stats().bytes_cached, 0u);
  // Both blocks in use and nothing cached: the next request fails cleanly.
  EXPECT_EQ(cache.Allocate(1 << 22), nullptr);
  cache.Free(c, 5000);
  cache.Free(d, 100000);
  EXPECT_EQ(cache.stats().bytes_in_use, 0u);
  EXPECT_GE(cache.stats().peak_bytes_in_use, BlockSizeClass(5000) + BlockSizeClass(100000));
}

TEST(BlockCacheTest, ResetPeakRestartsAtTheBytesInUse) {
  BlockCache cache([](size_t bytes) { return std::malloc(bytes); }, [](void* p) { std::free(p); });
  void* a = cache.Allocate(4096);
  void* b = cache.Allocate(8192);
  cache.Free(b, 8192);
  EXPECT_EQ(cache.stats().peak_bytes_in_use, 4096u + 8192u);
  cache.ResetPeak();
  EXPECT_EQ(cache.stats().peak_bytes_in_use, 4096u);
  void* c = cache.Allocate(1024);
  EXPECT_EQ(cache.stats().peak_bytes_in_use, 4096u + 1024u);
  cache.Free(c, 1024);
  cache.Free(a, 4096);
}

// A source that hands out distinct fake addresses and counts what it holds.
struct FakeSource {
  int live = 0;
  uintptr_t next = 0x10000;
  std::function<void*(size_t)> alloc() {
    return [this](size_t bytes) -> void* {
      ++live;
      const uintptr_t p = next;
      next += (bytes + 4095) / 4096 * 4096;
      return reinterpret_cast<void*>(p);
    };
  }
  std::function<void(void*)> free() {
    return [this](void*) { --live; };
  }
};

TEST(BlockCachePoolTest, BlocksOfAPoolNeverReachOtherTensors) {
  FakeSource src;
  BlockCache cache(src.alloc(), src.free());
  void* shared_before = cache.Allocate(1000);
  cache.Free(shared_before, 1000);  // a free shared block of the 1024 class
  const BlockCache::PoolId pool = cache.CreatePool();
  ASSERT_TRUE(cache.BeginPool(pool));
  EXPECT_FALSE(cache.BeginPool(cache.CreatePool())) << "one active pool at a time";
  // Inside the pool: not served from the shared cache, even for a class it holds.
  void* scratch = cache.Allocate(1000);
  EXPECT_NE(scratch, shared_before);
  void* output = cache.Allocate(5000);
  cache.Free(scratch, 1000);  // scratch of the capture: back to the pool
  void* again = cache.Allocate(900);
  EXPECT_EQ(again, scratch) << "the pool reuses its own free blocks";
  cache.Free(again, 900);
  cache.EndPool();
  // Outside: the pool's free block is not handed out; the shared one is.
  void* outside = cache.Allocate(1000);
  EXPECT_EQ(outside, shared_before);
  void* outside2 = cache.Allocate(1000);
  EXPECT_NE(outside2, scratch);
  // A live block of the pool freed later (any time) returns to the pool.
  cache.Free(output, 5000);
  void* outside3 = cache.Allocate(5000);
  EXPECT_NE(outside3, output);
  EXPECT_EQ(cache.stats().bytes_in_pools, BlockSizeClass(1000) + BlockSizeClass(5000));
  // Another capture in the same pool takes the pool's free blocks.
  ASSERT_TRUE(cache.BeginPool(pool));
  EXPECT_EQ(cache.Allocate(5000), output);
  cache.EndPool();
  // Released: the free blocks become shared cache; the live one goes there when freed.
  cache.ReleasePool(pool);
  EXPECT_EQ(cache.stats().bytes_in_pools, 0u);
  EXPECT_EQ(cache.Allocate(1000), scratch);
  cache.Free(output, 5000);
  cache.Free(outside3, 5000);
  cache.Free(outside, 1000);
  cache.Free(outside2, 1000);
  cache.Free(scratch, 1000);
  EXPECT_EQ(cache.stats().bytes_in_use, 0u);
  cache.ReleaseCached();
  EXPECT_EQ(src.live, 0);
  EXPECT_EQ(cache.stats().bytes_cached, 0u);
}

TEST(BlockCachePoolTest, BlocksFreedDuringACaptureJoinThePool) {
  FakeSource src;
  BlockCache cache(src.alloc(), src.free());
  void* before = cache.Allocate(2000);  // made before the capture, used by it, freed during it
  const BlockCache::PoolId pool = cache.CreatePool();
  ASSERT_TRUE(cache.BeginPool(pool));
  cache.Free(before, 2000);
  cache.EndPool();
  EXPECT_NE(cache.Allocate(2000), before) << "the graph may still use it";
  ASSERT_TRUE(cache.BeginPool(pool));
  EXPECT_EQ(cache.Allocate(2000), before);
  cache.EndPool();
}

TEST(BlockCachePoolTest, OnlyTheCapturingThreadUsesThePool) {
  FakeSource src;
  BlockCache cache(src.alloc(), src.free());
  void* shared = cache.Allocate(1000);
  cache.Free(shared, 1000);
  const BlockCache::PoolId pool = cache.CreatePool();
  ASSERT_TRUE(cache.BeginPool(pool));
  void* other = nullptr;
  std::thread t([&] {
    other = cache.Allocate(1000);  // another thread: the shared cache
    cache.EndPool();               // not its pool: no effect
  });
  t.join();
  EXPECT_EQ(other, shared);
  void* mine = cache.Allocate(1000);
  EXPECT_NE(mine, shared);
  cache.EndPool();
  cache.Free(mine, 1000);
  cache.Free(other, 1000);
  EXPECT_NE(cache.Allocate(1000), mine);
}

}  // namespace
}  // namespace orrery
