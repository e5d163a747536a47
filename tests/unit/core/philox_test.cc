#include "core/philox.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/thread_pool.h"

namespace orrery {
namespace {

// Known-answer vectors of Philox4x32-10 published with Random123 (kat_vectors).
TEST(PhiloxTest, KnownAnswers) {
  Philox4x32 r = PhiloxBlock({{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
  r = PhiloxBlock({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu);
  EXPECT_EQ(r.v[0], 0x408f276du);
  EXPECT_EQ(r.v[1], 0x41c83b0eu);
  EXPECT_EQ(r.v[2], 0xa20bc7c6u);
  EXPECT_EQ(r.v[3], 0x6d5451fdu);
  r = PhiloxBlock({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(r.v[0], 0xd16cfe09u);
  EXPECT_EQ(r.v[1], 0x94fdccebu);
  EXPECT_EQ(r.v[2], 0x5001e420u);
  EXPECT_EQ(r.v[3], 0x24126ea1u);
}

TEST(PhiloxTest, StreamsAreReproducibleAndIndependentOfOrder) {
  PhiloxGenerator g(42, 7);
  std::vector<uint32_t> seq;
  for (int i = 0; i < 100; ++i) seq.push_back(g.NextU32());
  // Random access gives the same words.
  for (int i = 99; i >= 0; --i) EXPECT_EQ(PhiloxWord(42, 7, i), seq[i]);
  // Parallel generation with any split gives the same words.
  std::vector<uint32_t> par(100);
  ThreadPool pool(3);
  pool.ParallelFor(100, 7, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) par[i] = PhiloxWord(42, 7, i);
  });
  EXPECT_EQ(par, seq);
  // Another seed or stream differs.
  EXPECT_NE(PhiloxWord(43, 7, 0), seq[0]);
  EXPECT_NE(PhiloxWord(42, 8, 0), seq[0]);
  // Restoring the offset resumes the stream.
  PhiloxGenerator h(42, 7);
  h.set_offset(50);
  EXPECT_EQ(h.NextU32(), seq[50]);
}

TEST(PhiloxTest, Distributions) {
  const int n = 200000;
  double sum = 0, sum2 = 0, usum = 0;
  float umin = 1;
  for (int i = 0; i < n; ++i) {
    float x = PhiloxNormal(1, 2, i);
    sum += x;
    sum2 += x * x;
    float u = PhiloxUniform(1, 3, i);
    usum += u;
    umin = std::min(umin, u);
    ASSERT_GT(u, 0.0f);
    ASSERT_LE(u, 1.0f);
  }
  // Standard errors: mean 1/sqrt(n) = 0.0022; allow 5 sigma.
  EXPECT_NEAR(sum / n, 0.0, 0.012);
  EXPECT_NEAR(sum2 / n, 1.0, 0.02);
  EXPECT_NEAR(usum / n, 0.5, 0.0035);
  PhiloxGenerator g(5, 0);
  std::vector<int> counts(6);
  for (int i = 0; i < 60000; ++i) counts[g.UniformInt(6)]++;
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);
}

}  // namespace
}  // namespace orrery
