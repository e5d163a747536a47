#include "core/crc32c.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace orrery {
namespace {

// The CRC-32C check value (RFC 3720's polynomial; "123456789" -> 0xE3069283) and the iSCSI test
// vectors of RFC 3720 B.4: 32 zero bytes, 32 0xFF bytes, 0..31 ascending.
TEST(Crc32cTest, StandardVectors) {
  for (auto* f : {&Crc32c, &Crc32cPortable}) {
    EXPECT_EQ(f(0, "123456789", 9), 0xE3069283u);
    std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF), ascending(32);
    for (int i = 0; i < 32; ++i) ascending[i] = static_cast<uint8_t>(i);
    EXPECT_EQ(f(0, zeros.data(), 32), 0x8A9136AAu);
    EXPECT_EQ(f(0, ones.data(), 32), 0x62A8AB43u);
    EXPECT_EQ(f(0, ascending.data(), 32), 0x46DD794Eu);
    EXPECT_EQ(f(0, nullptr, 0), 0u);
  }
}

// Incremental over any split, and the fast path equals the table at every length and alignment.
TEST(Crc32cTest, IncrementalAndFastPathEqualTheTable) {
  std::mt19937 rng(7);
  std::vector<uint8_t> data(1000);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t start = 0; start < 9; ++start) {
    for (size_t n : {0, 1, 7, 8, 9, 63, 64, 65, 991}) {
      const uint8_t* p = data.data() + start;
      const uint32_t whole = Crc32cPortable(0, p, n);
      EXPECT_EQ(Crc32c(0, p, n), whole) << start << " " << n;
      for (size_t cut : {size_t{0}, n / 3, n}) {
        EXPECT_EQ(Crc32c(Crc32c(0, p, cut), p + cut, n - cut), whole) << start << " " << n;
      }
    }
  }
  // One flipped bit changes it.
  const uint32_t before = Crc32c(0, data.data(), data.size());
  data[500] ^= 0x10;
  EXPECT_NE(Crc32c(0, data.data(), data.size()), before);
}

}  // namespace
}  // namespace orrery
