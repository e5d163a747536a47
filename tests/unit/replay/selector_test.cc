// Item selectors: distributions (chi-square) for Uniform and Prioritized, order for Fifo, Lifo
// and the heaps, and the sum tree against a brute-force prefix search.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "actors/replay/item_selector.h"
#include "actors/replay/sum_tree.h"

namespace orrery::replay {
namespace {

// Chi-square critical value for p = 0.001 and 9 degrees of freedom: a correct sampler fails one
// run in a thousand; the seed is fixed, so the test is deterministic.
constexpr double kChi2Critical9 = 27.877;

double ChiSquare(const std::vector<int>& counts, const std::vector<double>& probs, int n) {
  double chi2 = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double expected = probs[i] * n;
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return chi2;
}

TEST(SelectorTest, UniformIsUniform) {
  auto s = MakeSelector({SelectorKind::kUniform, 1.0});
  // Keys with gaps and deletions, so holes in the tree are exercised.
  for (uint64_t k = 1; k <= 20; ++k) ASSERT_TRUE(s->Insert(k * 3, 1.0, k).ok());
  for (uint64_t k = 2; k <= 20; k += 2) ASSERT_TRUE(s->Delete(k * 3).ok());
  ASSERT_EQ(s->size(), 10u);
  std::map<uint64_t, int> index;
  for (uint64_t k = 1; k <= 20; k += 2) index[k * 3] = static_cast<int>(index.size());
  PhiloxGenerator rng(7, 0);
  std::vector<int> counts(10, 0);
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    Selection sel = *s->Select(rng);
    ASSERT_TRUE(index.count(sel.key)) << sel.key;
    EXPECT_DOUBLE_EQ(sel.probability, 0.1);
    ++counts[index[sel.key]];
  }
  EXPECT_LT(ChiSquare(counts, std::vector<double>(10, 0.1), n), kChi2Critical9);
}

TEST(SelectorTest, PrioritizedFollowsPriorityToTheExponent) {
  const double alpha = 0.7;
  auto s = MakeSelector({SelectorKind::kPrioritized, alpha});
  std::vector<double> probs;
  double total = 0;
  for (int i = 1; i <= 10; ++i) {
    // Insert with a wrong priority first and fix it by an update.
    ASSERT_TRUE(s->Insert(i, 100.0, i).ok());
    ASSERT_TRUE(s->Update(i, i, 100 + i).ok());
    probs.push_back(std::pow(i, alpha));
    total += probs.back();
  }
  for (double& p : probs) p /= total;
  PhiloxGenerator rng(11, 0);
  std::vector<int> counts(10, 0);
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    Selection sel = *s->Select(rng);
    ASSERT_GE(sel.key, 1u);
    ASSERT_LE(sel.key, 10u);
    EXPECT_NEAR(sel.probability, probs[sel.key - 1], 1e-12);
    ++counts[sel.key - 1];
  }
  EXPECT_LT(ChiSquare(counts, probs, n), kChi2Critical9);
}

TEST(SelectorTest, PrioritizedNeverPicksZeroPriorityUnlessAllAreZero) {
  auto s = MakeSelector({SelectorKind::kPrioritized, 1.0});
  ASSERT_TRUE(s->Insert(1, 0.0, 1).ok());
  ASSERT_TRUE(s->Insert(2, 5.0, 2).ok());
  ASSERT_TRUE(s->Insert(3, 0.0, 3).ok());
  PhiloxGenerator rng(1, 0);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(s->Select(rng)->key, 2u);
  ASSERT_TRUE(s->Update(2, 0.0, 4).ok());
  std::map<uint64_t, int> seen;
  for (int i = 0; i < 3000; ++i) ++seen[s->Select(rng)->key];
  EXPECT_EQ(seen.size(), 3u);  // uniform fallback
  EXPECT_FALSE(s->Insert(4, -1.0, 5).ok());
  EXPECT_FALSE(s->Update(1, std::nan(""), 6).ok());
}

TEST(SelectorTest, FifoLifoAndHeaps) {
  PhiloxGenerator rng(0, 0);
  auto fifo = MakeSelector({SelectorKind::kFifo, 1.0});
  auto lifo = MakeSelector({SelectorKind::kLifo, 1.0});
  auto min_heap = MakeSelector({SelectorKind::kMinHeap, 1.0});
  auto max_heap = MakeSelector({SelectorKind::kMaxHeap, 1.0});
  const double priorities[] = {5, 1, 9, 1, 9};
  for (uint64_t k = 1; k <= 5; ++k) {
    for (auto* s : {&fifo, &lifo, &min_heap, &max_heap}) {
      ASSERT_TRUE((*s)->Insert(k, priorities[k - 1], k).ok());
    }
  }
  EXPECT_EQ(fifo->Select(rng)->key, 1u);
  EXPECT_EQ(lifo->Select(rng)->key, 5u);
  EXPECT_EQ(min_heap->Select(rng)->key, 2u);  // priority 1, inserted before key 4
  EXPECT_EQ(max_heap->Select(rng)->key, 3u);  // priority 9, inserted before key 5
  // Updating key 2 (same priority) makes it the most recently touched: key 4 wins the tie.
  ASSERT_TRUE(min_heap->Update(2, 1.0, 10).ok());
  EXPECT_EQ(min_heap->Select(rng)->key, 4u);
  ASSERT_TRUE(max_heap->Update(1, 100.0, 11).ok());
  EXPECT_EQ(max_heap->Select(rng)->key, 1u);
  ASSERT_TRUE(fifo->Delete(1).ok());
  EXPECT_EQ(fifo->Select(rng)->key, 2u);
  ASSERT_TRUE(lifo->Delete(5).ok());
  EXPECT_EQ(lifo->Select(rng)->key, 4u);
  EXPECT_FALSE(fifo->Delete(1).ok());
  EXPECT_FALSE(fifo->Insert(3, 0, 0).ok());  // keys must increase
  EXPECT_EQ(fifo->Select(rng)->probability, 1.0);
  auto empty = MakeSelector({SelectorKind::kUniform, 1.0});
  EXPECT_EQ(empty->Select(rng).status().code(), StatusCode::kFailedPrecondition);
}

TEST(SumTreeTest, FindMatchesBruteForceThroughCompactions) {
  SumTree tree;
  std::map<uint64_t, double> ref;  // key order = slot order
  PhiloxGenerator rng(3, 0);
  uint64_t next = 1;
  for (int step = 0; step < 3000; ++step) {
    const uint32_t op = rng.NextU32() % 3;
    if (op < 2 || ref.empty()) {
      const double w = static_cast<double>(rng.NextU32() % 8);  // integers: exact sums
      ASSERT_TRUE(tree.Insert(next, w).ok());
      ref[next++] = w;
    } else {
      auto it = ref.begin();
      std::advance(it, rng.UniformInt(ref.size()));
      ASSERT_TRUE(tree.Erase(it->first).ok());
      ref.erase(it);
    }
    double total = 0;
    for (auto& [k, w] : ref) total += w;
    ASSERT_EQ(tree.total(), total);
    ASSERT_EQ(tree.size(), ref.size());
    if (total == 0) continue;
    const double u = std::floor(UniformDouble(rng) * total);
    double prefix = 0;
    uint64_t expected = 0;
    for (auto& [k, w] : ref) {
      if (w > 0 && u < prefix + w) {
        expected = k;
        break;
      }
      prefix += w;
    }
    ASSERT_EQ(tree.Find(u), expected) << "step " << step;
  }
}

}  // namespace
}  // namespace orrery::replay
