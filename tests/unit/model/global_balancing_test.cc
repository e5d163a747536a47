// Order statistics and Quantile Balancing over several ranks (model/global_order_statistics.h):
// ranks are threads here, summing through a shared buffer, and every result is compared with the
// single-process computation over all ranks' data concatenated — the global batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/philox.h"
#include "model/global_order_statistics.h"
#include "model/quantile_balancing.h"

namespace orrery::model {
namespace {

// `world` ranks as threads; Group(r).sum adds a buffer over them (every rank must call it).
class ThreadRanks {
 public:
  explicit ThreadRanks(int world) : world_(world), barrier_(world) {}

  RankGroup Group(int rank) {
    return {rank, world_, [this](std::span<double> d) { return Sum(d); }};
  }
  void Run(const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < world_; ++r) threads.emplace_back(fn, r);
    for (std::thread& t : threads) t.join();
  }

 private:
  Status Sum(std::span<double> d) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (acc_.empty()) acc_.assign(d.size(), 0.0);
      if (acc_.size() != d.size()) return InternalError("ranks summed different sizes");
      for (size_t i = 0; i < d.size(); ++i) acc_[i] += d[i];
    }
    barrier_.arrive_and_wait();
    std::copy(acc_.begin(), acc_.end(), d.begin());
    barrier_.arrive_and_wait();
    {
      std::lock_guard<std::mutex> lock(mu_);
      acc_.clear();
    }
    barrier_.arrive_and_wait();
    return Status::OK();
  }

  int world_;
  std::barrier<> barrier_;
  std::mutex mu_;
  std::vector<double> acc_;
};

// Exact against a sort of every rank's values: uneven columns (one rank holds none of column 1),
// ties (column 2 draws from 5 values), and small bins and candidate counts so that several
// narrowing passes run before the gather.
TEST(GlobalOrderStatistics, EqualsTheSortOfEveryRanksValues) {
  constexpr int kWorld = 3;
  PhiloxGenerator gen(5, 0);
  std::vector<std::vector<std::vector<double>>> cols(kWorld, std::vector<std::vector<double>>(3));
  std::vector<std::vector<double>> all(3);
  for (int r = 0; r < kWorld; ++r) {
    for (int c = 0; c < 3; ++c) {
      const int n = c == 1 && r == 1 ? 0 : 200 + 150 * r;
      for (int i = 0; i < n; ++i) {
        const double v =
            c == 2 ? static_cast<double>(gen.UniformInt(5)) / 4.0 : 2.0 * gen.Uniform() - 1.0;
        cols[r][c].push_back(v);
        all[c].push_back(v);
      }
    }
  }
  for (auto& a : all) std::sort(a.begin(), a.end(), std::greater<double>());
  const std::vector<double> lo = {-1, -1, -1}, hi = {1, 1, 1};
  OrderStatisticsOptions o;
  o.bins = 8;
  o.candidates = 4;
  o.passes = 12;
  for (int64_t t : {1, 2, 37, 300, 549}) {
    const std::vector<int64_t> targets = {t, std::min<int64_t>(t, 550), t};
    std::vector<std::vector<double>> got(kWorld);
    ThreadRanks ranks(kWorld);
    ranks.Run([&](int r) {
      auto v = GlobalOrderStatistics(cols[r], lo, hi, targets, ranks.Group(r), o);
      ASSERT_TRUE(v.ok()) << v.status().ToString();
      got[r] = *v;
    });
    for (int r = 0; r < kWorld; ++r) {
      for (int c = 0; c < 3; ++c) {
        EXPECT_EQ(got[r][c], all[c][targets[c] - 1])
            << "rank " << r << " column " << c << " t " << t;
      }
    }
  }
}

TEST(GlobalOrderStatistics, RejectsARankBeyondTheValues) {
  auto v = GlobalOrderStatistics({{0.5, 0.25}}, {0}, {1}, {3}, RankGroup{});
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("asks for rank 3 of 2 values"), std::string::npos);
}

Tensor Scores(int64_t m, int64_t n, uint64_t seed) {
  Tensor s = Tensor::Empty({m, n}, DType::kF32);
  PhiloxGenerator gen(seed, 0);
  for (int64_t i = 0; i < m * n; ++i) {
    const double logit = gen.Normal() + 2.0 * static_cast<double>(i % n) / static_cast<double>(n);
    s.data<float>()[i] = static_cast<float>(1.0 / (1.0 + std::exp(-logit)));
  }
  return s;
}

// Three ranks with 300, 1000 and 77 rows: each rank's step gives exactly the biases and loads of
// one step over the 1377 rows together, for both forms; the average of the three per-rank steps
// (what the RL learner did before) does not.
TEST(GlobalQuantileBalancing, RanksTakeTheGlobalBatchStep) {
  constexpr int kWorld = 3, kExperts = 16;
  const int64_t rows[kWorld] = {300, 1000, 77};
  for (Balancing form : {Balancing::kQuantileExclusive, Balancing::kQuantileCutoff}) {
    MoeConfig c;
    c.num_experts = kExperts;
    c.top_k = 4;
    c.balancing = form;
    std::vector<Tensor> scores;
    Tensor all = Tensor::Empty({1377, kExperts}, DType::kF32);
    int64_t at = 0;
    for (int r = 0; r < kWorld; ++r) {
      scores.push_back(Scores(rows[r], kExperts, 40 + r));
      std::copy_n(scores[r].data<float>(), scores[r].numel(), all.data<float>() + at);
      at += scores[r].numel();
    }
    Tensor start = Tensor::Zeros({kExperts}, DType::kF32);
    for (int j = 0; j < kExperts; ++j) start.data<float>()[j] = 0.01f * static_cast<float>(j % 3);
    Tensor global = start.Clone();
    QuantileBalancingResult g;
    ASSERT_TRUE(QuantileBalancingStep({&all}, c, &global, &g).ok());

    std::vector<Tensor> biases(kWorld);
    std::vector<QuantileBalancingResult> results(kWorld);
    ThreadRanks ranks(kWorld);
    ranks.Run([&](int r) {
      biases[r] = start.Clone();
      ASSERT_TRUE(
          QuantileBalancingStep({&scores[r]}, c, &biases[r], &results[r], ranks.Group(r)).ok());
    });
    double averaged_gap = 0;
    for (int j = 0; j < kExperts; ++j) {
      double mean = 0;
      for (int r = 0; r < kWorld; ++r) {
        EXPECT_EQ(biases[r].data<float>()[j], global.data<float>()[j]) << "rank " << r;
        Tensor alone = start.Clone();
        QuantileBalancingResult ignored;
        ASSERT_TRUE(QuantileBalancingStep({&scores[r]}, c, &alone, &ignored).ok());
        mean += alone.data<float>()[j] / kWorld;
      }
      averaged_gap = std::max(averaged_gap, std::abs(mean - global.data<float>()[j]));
    }
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(results[r].load, g.load);
      EXPECT_EQ(results[r].max_violation_after, g.max_violation_after);
    }
    EXPECT_GT(averaged_gap, 1e-4) << "the per-rank average should differ from the global step";
  }
}

// The step where the scores are (the GPU model's; here on the ops' CPU twins) with several ranks:
// a radix select whose histograms are summed over the ranks gives exactly the global batch's step,
// split into micro-batches or not, and a rank that holds no scores still takes part.
TEST(GlobalQuantileBalancing, WhereScoresAreRanksTakeTheGlobalBatchStep) {
  constexpr int kWorld = 3, kExperts = 16;
  const int64_t rows[kWorld] = {300, 0, 77};
  for (Balancing form : {Balancing::kQuantileExclusive, Balancing::kQuantileCutoff}) {
    MoeConfig c;
    c.num_experts = kExperts;
    c.top_k = 4;
    c.balancing = form;
    std::vector<std::vector<Tensor>> scores(kWorld);
    Tensor all = Tensor::Empty({377, kExperts}, DType::kF32);
    int64_t at = 0;
    for (int r = 0; r < kWorld; ++r) {
      if (rows[r] == 0) continue;  // rank 1 holds no scores
      const Tensor s = Scores(rows[r], kExperts, 60 + r);
      std::copy_n(s.data<float>(), s.numel(), all.data<float>() + at);
      at += s.numel();
      // Two micro-batches of uneven size.
      scores[r].push_back(s.Slice(0, rows[r] / 3).value().Clone());
      scores[r].push_back(s.Slice(rows[r] / 3, rows[r]).value().Clone());
    }
    Tensor start = Tensor::Zeros({kExperts}, DType::kF32);
    for (int j = 0; j < kExperts; ++j) start.data<float>()[j] = 0.02f * static_cast<float>(j % 4);
    Tensor global = start.Clone();
    QuantileBalancingResult g;
    ASSERT_TRUE(QuantileBalancingStep({&all}, c, &global, &g).ok());

    std::vector<Tensor> biases(kWorld);
    std::vector<QuantileBalancingResult> results(kWorld);
    std::vector<Status> status(kWorld);
    ThreadRanks ranks(kWorld);
    ranks.Run([&](int r) {
      biases[r] = start.Clone();
      status[r] = QuantileBalancingStepWhereScoresAre(scores[r], c, &biases[r], &results[r],
                                                      ranks.Group(r));
    });
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r].ToString();
      for (int j = 0; j < kExperts; ++j) {
        EXPECT_EQ(biases[r].data<float>()[j], global.data<float>()[j]) << "rank " << r;
      }
      EXPECT_EQ(results[r].load, g.load);
      EXPECT_EQ(results[r].max_violation_after, g.max_violation_after);
      EXPECT_EQ(results[r].bias_change, g.bias_change);
    }
  }
}

}  // namespace
}  // namespace orrery::model
