// The row maps of the attention forward kernels (attention_tc_layout.h: CausalRows, PrefixRows)
// run through the tensor-core forward's loop structure on the host (as attention_tc_layout_test.cc
// does for the causal case): a block's key-tile range, the wholly-visible test, the warp skips
// and the per-element masks must compute every visible (query, key) pair of prefix-causal
// attention exactly once and no hidden pair at all (keys past the end included), on ragged
// layouts with one query per document, all-query documents, documents without queries and
// lengths on no tile boundary. Visibility is written here from the definition, independently of
// DocOf.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/philox.h"
#include "kernels/cuda/attention_tc_layout.h"

namespace orrery::kernels::cuda::attention_tc {
namespace {

constexpr int kRows = 64, kWarpRows = 16;

struct PrefixLayout {
  std::vector<int64_t> cu_q{0}, cu_k{0};
  PrefixLayout(const std::vector<int64_t>& queries, const std::vector<int64_t>& keys) {
    for (size_t d = 0; d < queries.size(); ++d) {
      cu_q.push_back(cu_q.back() + queries[d]);
      cu_k.push_back(cu_k.back() + keys[d]);
    }
  }
  int64_t nq() const { return cu_q.back(); }
  int64_t nk() const { return cu_k.back(); }
  PrefixRows Rows() const {
    return {cu_q.data(), cu_k.data(), static_cast<int64_t>(cu_q.size()), nq()};
  }
  // Query i of document d (its local index i - cu_q[d], of n queries over L keys) sees the
  // document's keys 0 .. L - n + (i - cu_q[d]).
  bool Visible(int64_t i, int64_t j) const {
    for (size_t d = 0; d + 1 < cu_q.size(); ++d) {
      if (i < cu_q[d] || i >= cu_q[d + 1]) continue;
      const int64_t n = cu_q[d + 1] - cu_q[d], len = cu_k[d + 1] - cu_k[d];
      return j >= cu_k[d] && j - cu_k[d] <= len - n + (i - cu_q[d]);
    }
    return false;
  }
};

// The forward's loop (attention_forward_tc.cu) with a row map: [query][key] counts, keys padded.
template <class Rows>
std::vector<int> ForwardCounts(const Rows& rows, int64_t nq, int64_t nk, int tile) {
  const int64_t width = nk + kRows;
  std::vector<int> count(static_cast<size_t>(nq * width), 0);
  for (int64_t q0 = 0; q0 < nq; q0 += kRows) {
    const int64_t q_last = std::min<int64_t>(q0 + kRows, nq) - 1;
    const int64_t kv_begin = rows.First(q0), last_start = rows.First(q_last);
    const int64_t first_end = rows.Last(q0);
    for (int it = 0; it < KeyTiles(kv_begin, rows.Last(q_last), tile); ++it) {
      const int64_t kb = kv_begin + int64_t{it} * tile;
      const bool wholly = KeyTileWhollyVisible(kb, tile, first_end, last_start);
      for (int w = 0; w < kRows / kWarpRows; ++w) {
        const int64_t first = q0 + w * kWarpRows;
        const int64_t last = std::min(first + kWarpRows - 1, q_last);
        if (!WarpSeesKeyTile(kb, tile, rows.First(first), rows.Last(last))) continue;
        for (int64_t row = first; row < first + kWarpRows; ++row) {
          const int lo = ClampToTile(rows.First(row) - kb, tile);
          const int hi = ClampToTile(rows.Last(row) - kb, tile);
          for (int c = 0; c < tile; ++c) {
            if (row < nq && (wholly || (lo <= c && c <= hi))) {
              EXPECT_LT(kb + c, width) << "a key tile past the padded keys";
              if (kb + c < width) ++count[static_cast<size_t>(row * width + kb + c)];
            }
          }
        }
      }
    }
  }
  return count;
}

void CheckPrefix(const std::vector<int64_t>& queries, const std::vector<int64_t>& keys) {
  const PrefixLayout d(queries, keys);
  const int64_t nq = d.nq(), nk = d.nk();
  SCOPED_TRACE("nq " + std::to_string(nq) + " nk " + std::to_string(nk));
  for (const int tile : {64, 32}) {
    const std::vector<int> count = ForwardCounts(d.Rows(), nq, nk, tile);
    for (int64_t i = 0; i < nq; ++i) {
      for (int64_t j = 0; j < nk + kRows; ++j) {
        ASSERT_EQ(count[static_cast<size_t>(i * (nk + kRows) + j)], d.Visible(i, j) ? 1 : 0)
            << "key tile " << tile << ": query " << i << " key " << j;
      }
    }
  }
}

TEST(AttentionPrefixLayout, TilesCoverEachVisiblePairOnce) {
  // (queries, keys) per document: decode-like single queries at the end of long contexts, a
  // document that is all queries, a document without queries between two with, lengths one off
  // the 64-row tiles, a chunk of 65 queries at the end of 300 keys.
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> layouts = {
      {{1, 1, 1}, {200, 7, 64}},
      {{63, 64, 65}, {63, 64, 65}},
      {{3, 0, 70}, {100, 45, 70}},
      {{65}, {300}},
      {{1}, {1}},
      {{0, 5, 0}, {3, 9, 0}},
      {{17, 130, 1, 64}, {17, 400, 129, 128}},
  };
  for (const auto& [q, k] : layouts) CheckPrefix(q, k);
  PhiloxGenerator rng(91, 0);
  for (int trial = 0; trial < 30; ++trial) {
    std::vector<int64_t> q(1 + rng.UniformInt(6)), k(q.size());
    for (size_t i = 0; i < q.size(); ++i) {
      k[i] = static_cast<int64_t>(rng.UniformInt(trial % 2 ? 20 : 300));
      q[i] = k[i] == 0 ? 0 : static_cast<int64_t>(rng.UniformInt(static_cast<uint64_t>(k[i]) + 1));
    }
    CheckPrefix(q, k);
  }
}

// With cu_q == cu_k the prefix map is the causal one, row by row (padding rows see nothing in
// both).
TEST(AttentionPrefixLayout, EqualsTheCausalMapWhenQueriesAreTheContext) {
  const std::vector<int64_t> lengths = {1, 63, 0, 130, 5};
  const PrefixLayout d(lengths, lengths);
  const CausalRows causal{d.cu_q.data(), static_cast<int64_t>(d.cu_q.size()), d.nq()};
  const PrefixRows prefix = d.Rows();
  for (int64_t i = 0; i < d.nq(); ++i) {
    EXPECT_EQ(prefix.First(i), causal.First(i)) << i;
    EXPECT_EQ(prefix.Last(i), causal.Last(i)) << i;
  }
  for (int64_t i = d.nq(); i < d.nq() + kRows; ++i) {
    EXPECT_GT(prefix.First(i), prefix.Last(i)) << i;
    EXPECT_GT(causal.First(i), causal.Last(i)) << i;
  }
}

}  // namespace
}  // namespace orrery::kernels::cuda::attention_tc
