// CRC-32C (Castagnoli): the checksum of files and chunks that cross the network or the disk
// (published weights fetched by rollouts, actors/rl/weight_fetcher.h). Incremental:
//
//   uint32_t crc = 0;
//   crc = Crc32c(crc, first.data(), first.size());
//   crc = Crc32c(crc, rest.data(), rest.size());   // == Crc32c(0, whole, n)
//
// The SSE4.2 instruction where the CPU has it (about 10 GB/s), else a table (about 0.5 GB/s);
// both give the same value. Check value: Crc32c(0, "123456789", 9) == 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>

namespace orrery {

uint32_t Crc32c(uint32_t crc, const void* data, size_t n);

// The portable table implementation (what Crc32c uses without SSE4.2; tests compare the two).
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n);

}  // namespace orrery
