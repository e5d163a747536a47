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
#include <string>

#include "core/status.h"

namespace orrery {

uint32_t Crc32c(uint32_t crc, const void* data, size_t n);

// The CRC-32C of the first `bytes` of the open file `fd` (read with pread in 8 MiB pieces; the
// offset of `fd` is unchanged). A file shorter than `bytes` is DataLoss; errors name `what`.
StatusOr<uint32_t> Crc32cOfFile(int fd, int64_t bytes, const std::string& what);

// The portable table implementation (what Crc32c uses without SSE4.2; tests compare the two).
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n);

}  // namespace orrery
