#include "core/block_cache.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

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

}  // namespace
}  // namespace orrery
