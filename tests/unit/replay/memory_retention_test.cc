// RetainFreedMemory: a memtable-sized block comes from the heap and stays there once freed, so
// the next memtable reuses it instead of faulting in new pages.
#include "actors/replay/memory_retention.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>
#include <cstring>

namespace orrery::replay {
namespace {

TEST(MemoryRetentionTest, AFreedMemtableBlockStaysInTheHeap) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the sanitizer's allocator has no glibc malloc policy";
#endif
  RetainFreedMemory(8 << 20);
  constexpr size_t kBlock = 3 << 20;  // above glibc's default mmap threshold (128 KiB-32 MiB)
  const size_t mapped_before = mallinfo2().hblks;
  char* block = static_cast<char*>(std::malloc(kBlock));
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, kBlock);
  EXPECT_EQ(mallinfo2().hblks, mapped_before) << "the block got its own mapping";
  const size_t heap_before_free = mallinfo2().arena;
  std::free(block);
  EXPECT_EQ(mallinfo2().arena, heap_before_free) << "the freed block went back to the kernel";
}

}  // namespace
}  // namespace orrery::replay
