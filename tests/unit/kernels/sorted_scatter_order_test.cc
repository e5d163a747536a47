// The plan of the embedding's deterministic scatter-add (kernels/cuda/sorted_scatter_order.h) on
// the CPU: every table row gets exactly one write of the sum of its rows, whatever the segments'
// lengths and where they fall against the chunks, and the host twin (which the GPU test holds the
// kernels to, bit for bit) equals a plain scatter-add to f32 rounding.
#include "kernels/cuda/sorted_scatter_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "core/philox.h"

namespace orrery::kernels::cuda {
namespace {

// The number of writes each key's table row receives from the plan's two passes over `keys`
// (sorted), and that every slot pass 2 reads was written by pass 1.
std::map<int32_t, int> TableWrites(const std::vector<int32_t>& keys) {
  const int64_t n = static_cast<int64_t>(keys.size());
  const int64_t chunks = (n + kScatterChunk - 1) / kScatterChunk;
  std::map<int32_t, int> writes;
  std::vector<bool> first(chunks), last(chunks);
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t begin = ScatterChunkBegin(k), end = ScatterChunkEnd(n, k);
    int64_t s = begin;
    for (int64_t e = begin; e < end; ++e) {
      if (e + 1 < end && keys[e + 1] == keys[e]) continue;
      switch (RunDestination(keys.data(), n, s, e + 1)) {
        case kScatterTable:
          ++writes[keys[e]];
          break;
        case kScatterFirstSlot:
          EXPECT_EQ(s, begin) << "a continued run must be the chunk's first";
          first[k] = true;
          break;
        case kScatterLastSlot:
          EXPECT_EQ(e + 1, end) << "a continuing run must be the chunk's last";
          last[k] = true;
          break;
      }
      s = e + 1;
    }
  }
  for (int64_t k = 0; k < chunks; ++k) {
    if (!ChunkOwnsSpanningSegment(keys.data(), n, k)) continue;
    EXPECT_TRUE(last[k]) << "chunk " << k;
    int64_t j = k + 1;
    EXPECT_TRUE(first[j]) << "chunk " << j;
    while (SegmentContinuesPast(keys.data(), n, j)) EXPECT_TRUE(first[++j]) << "chunk " << j;
    ++writes[keys[ScatterChunkEnd(n, k) - 1]];
  }
  return writes;
}

TEST(SortedScatterOrderTest, EveryKeyIsWrittenOnceWhereverItsSegmentFalls) {
  // Segment lengths around the chunk length: inside one chunk, ending exactly at a chunk end,
  // spanning two and many chunks, a chunk that is all one segment, one entry in all.
  const int c = kScatterChunk;
  for (const std::vector<int>& lengths : {std::vector<int>{1},
                                          {c},
                                          {c - 1, 1},
                                          {c, c},
                                          {c + 1},
                                          {5, 3 * c, 2},
                                          {2 * c - 3, 1, c + 2},
                                          {c - 1, 2 * c + 1, c},
                                          {1, 1, 1, 10 * c, 1}}) {
    std::vector<int32_t> keys;
    for (size_t i = 0; i < lengths.size(); ++i) keys.insert(keys.end(), lengths[i], 3 * i);
    const std::map<int32_t, int> writes = TableWrites(keys);
    EXPECT_EQ(writes.size(), lengths.size());
    for (const auto& [key, count] : writes) EXPECT_EQ(count, 1) << "key " << key;
  }
}

TEST(SortedScatterOrderTest, KeyBitsHoldTheOutOfRangeKey) {
  EXPECT_EQ(ScatterKeyBits(1), 1);
  EXPECT_EQ(ScatterKeyBits(131), 8);
  EXPECT_EQ(ScatterKeyBits(255), 8);
  EXPECT_EQ(ScatterKeyBits(256), 9);
  EXPECT_EQ(ScatterKeyBits(32768), 16);
  EXPECT_EQ(ScatterKeyBits(163840), 18);
  for (int64_t v : {1, 131, 255, 256, 32768, 163840}) {
    EXPECT_LT(v, int64_t{1} << ScatterKeyBits(v)) << v;
  }
}

// The twin against a plain scatter-add in f64: a hot id (a third of the rows), ids that repeat a
// few times, ids outside [0, vocab) (skipped), rows of one id spread over the positions.
TEST(SortedScatterOrderTest, HostTwinEqualsAPlainScatterAdd) {
  const int64_t n = 5000, vocab = 300, d = 5;
  PhiloxGenerator rng(9, 0);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids)
    id = rng.UniformInt(3) == 0 ? 17 : static_cast<int32_t>(rng.UniformInt(vocab));
  ids[10] = -1;
  ids[11] = static_cast<int32_t>(vocab);
  ids[12] = 1 << 30;
  std::vector<float> dy(n * d), table(vocab * d);
  for (float& x : dy) x = static_cast<float>(rng.Normal());
  for (float& x : table) x = static_cast<float>(rng.Normal());
  std::vector<double> want(table.begin(), table.end());
  for (int64_t r = 0; r < n; ++r) {
    if (ids[r] < 0 || ids[r] >= vocab) continue;
    for (int64_t c = 0; c < d; ++c) want[ids[r] * d + c] += dy[r * d + c];
  }
  SortedScatterAddInOrder(ids.data(), n, vocab, dy.data(), d, table.data());
  for (int64_t i = 0; i < vocab * d; ++i) {
    // Row 17 sums ~1700 terms in f32: ~sqrt(1700) * 40 * 6e-8 ~ 1e-4 at most.
    EXPECT_NEAR(table[i], want[i], 1e-3) << "row " << i / d << " column " << i % d;
  }
}

}  // namespace
}  // namespace orrery::kernels::cuda
