// RetainFreedMemory: the malloc policy of a process that serves a replay store.
//
// RocksDB frees a memtable (write_buffer_bytes, in arena blocks of up to 1 MiB) after each flush,
// several times a second under load. With glibc's defaults that memory goes back to the kernel
// (the heap's top is trimmed, or blocks below the dynamic mmap threshold are unmapped) and is
// faulted in again by the next memtable, so the store's resident memory swings by up to two
// memtables and the page faults cost CPU (docs/benchmarks.md, "Replay store soak"). Keeping freed
// memory for reuse makes the store's RSS its high-water mark: its base, the block cache and up to
// two memtables.
#pragma once

#include <cstdint>

namespace orrery::replay {

// Process-wide (mallopt): allocations below 4 MiB come from the heap instead of their own
// mappings, and the heap keeps up to 2 * write_buffer_bytes + 32 MiB free at its top instead of
// trimming it. Call once in the process that serves the store, before opening it. Logs a warning
// and changes nothing where the allocator refuses (a sanitizer's allocator).
void RetainFreedMemory(int64_t write_buffer_bytes);

}  // namespace orrery::replay
