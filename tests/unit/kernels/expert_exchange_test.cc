// The expert-parallel boundary of MoeExperts / MoeExpertsGrad (kernels/expert_exchange.h) on the
// CPU twin: W ranks, each a thread with its own tokens and a contiguous share of the experts,
// exchange rows through an in-process all-to-all (this file's ThreadExchange, a test double of
// the NCCL/Gloo implementations). Oracle: every rank running all experts locally (no exchange) on
// its own tokens. The sharded run must give each rank the same output, input gradient and routing
// weights' gradient, and each local expert's weight gradient must be the sum of the ranks'
// gradients of that expert (f64, to rounding: the owners multiply other row blocks together).
#include "kernels/expert_exchange.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "core/philox.h"
#include "kernels/moe.h"
#include "tests/unit/kernels/kda_test_util.h"

namespace orrery::kernels {
namespace {

using testing::RandomNormal;
using testing::RelRmsError;

// What the ranks of one group share: a barrier and one posted item per rank.
struct Group {
  int world;
  int64_t experts;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  int64_t generation = 0;
  std::vector<const void*> posted;

  Group(int w, int64_t e) : world(w), experts(e), posted(static_cast<size_t>(w)) {}

  void Barrier() {
    std::unique_lock<std::mutex> lock(mu);
    const int64_t gen = generation;
    if (++arrived == world) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen; });
    }
  }
  // Posts `item`, waits for every rank's, and returns them (valid until the caller's Done()).
  std::vector<const void*> Exchange(int rank, const void* item) {
    posted[static_cast<size_t>(rank)] = item;
    Barrier();
    return posted;
  }
  void Done() { Barrier(); }
};

class ThreadExchange : public ExpertExchange {
 public:
  ThreadExchange(Group* g, int rank) : g_(g), rank_(rank) {}
  int64_t num_experts() const override { return g_->experts; }
  int64_t local_experts() const override { return g_->experts / g_->world; }
  int64_t first_expert() const override { return rank_ * local_experts(); }

  StatusOr<ExpertExchangePlan> Plan(const std::vector<int64_t>& offsets) override {
    const int64_t le = local_experts(), first = first_expert();
    ExpertExchangePlan plan;
    plan.offsets = offsets;
    const auto all = g_->Exchange(rank_, &offsets);
    plan.owned_offsets.assign(static_cast<size_t>(le + 1), 0);
    for (int r = 0; r < g_->world; ++r) {
      const auto& off = *static_cast<const std::vector<int64_t>*>(all[static_cast<size_t>(r)]);
      for (int64_t j = 0; j < le; ++j) plan.received.push_back(off[first + j + 1] - off[first + j]);
    }
    for (int64_t j = 0; j < le; ++j) {
      int64_t rows = 0;
      for (int r = 0; r < g_->world; ++r) rows += plan.received[static_cast<size_t>(r * le + j)];
      plan.owned_offsets[static_cast<size_t>(j + 1)] = plan.owned_offsets[j] + rows;
    }
    g_->Done();
    return plan;
  }

  Status ToOwners(const Tensor& rows, const ExpertExchangePlan& plan, Tensor* owned) override {
    const Posted mine{&rows, &plan};
    const auto all = g_->Exchange(rank_, &mine);
    const int64_t le = local_experts(), first = first_expert();
    *owned = Tensor::Empty({plan.owned_offsets.back(), rows.dim(1)}, rows.dtype());
    const size_t row_bytes = DTypeSize(rows.dtype()) * static_cast<size_t>(rows.dim(1));
    for (int64_t j = 0; j < le; ++j) {
      int64_t at = plan.owned_offsets[j];
      for (int r = 0; r < g_->world; ++r) {
        const Posted& src = *static_cast<const Posted*>(all[static_cast<size_t>(r)]);
        const int64_t begin = src.plan->offsets[first + j];
        const int64_t count = src.plan->offsets[first + j + 1] - begin;
        CopyRows(*src.rows, begin, count, row_bytes, owned, at);
        at += count;
      }
    }
    g_->Done();
    return Status::OK();
  }

  Status FromOwners(const Tensor& owned, const ExpertExchangePlan& plan, Tensor* rows) override {
    const Posted mine{&owned, &plan};
    const auto all = g_->Exchange(rank_, &mine);
    const int64_t le = local_experts();
    *rows = Tensor::Empty({plan.offsets.back(), owned.dim(1)}, owned.dtype());
    const size_t row_bytes = DTypeSize(owned.dtype()) * static_cast<size_t>(owned.dim(1));
    for (int64_t e = 0; e < g_->experts; ++e) {
      const int owner = static_cast<int>(e / le);
      const int64_t j = e % le;
      const Posted& src = *static_cast<const Posted*>(all[static_cast<size_t>(owner)]);
      int64_t at = src.plan->owned_offsets[j];
      for (int r = 0; r < rank_; ++r) at += src.plan->received[static_cast<size_t>(r * le + j)];
      CopyRows(*src.rows, at, plan.offsets[e + 1] - plan.offsets[e], row_bytes, rows,
               plan.offsets[e]);
    }
    g_->Done();
    return Status::OK();
  }

 private:
  struct Posted {
    const Tensor* rows;
    const ExpertExchangePlan* plan;
  };
  static void CopyRows(const Tensor& src, int64_t begin, int64_t count, size_t row_bytes,
                       Tensor* dst, int64_t at) {
    if (count == 0) return;
    std::memcpy(static_cast<char*>(dst->raw_data()) + at * row_bytes,
                static_cast<const char*>(src.raw_data()) + begin * row_bytes, count * row_bytes);
  }
  Group* g_;
  int rank_;
};

struct RankData {
  Tensor xl, ids, weights, dy;
};

// Distinct random experts per token.
Tensor RandomIds(int64_t n, int64_t k, int64_t e, PhiloxGenerator& rng) {
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> row;
    while (static_cast<int64_t>(row.size()) < k) {
      const int32_t id = static_cast<int32_t>(rng.NextU32() % static_cast<uint32_t>(e));
      if (std::find(row.begin(), row.end(), id) == row.end()) row.push_back(id);
    }
    ids.insert(ids.end(), row.begin(), row.end());
  }
  return Tensor::FromVector<int32_t>({n, k}, ids);
}

Tensor ExpertsSlice(const Tensor& w, int64_t first, int64_t count) {
  return w.Slice(first, first + count).value().Clone();
}

void RunGroup(const std::vector<int64_t>& tokens) {
  const int world = static_cast<int>(tokens.size());
  const int64_t e = 3 * world, k = 2, l = 8, f = 12;
  GluActivation act;
  PhiloxGenerator rng(97 + world, 0);
  const Tensor w1 = RandomNormal({e, f, l}, DType::kF64, rng, 0.5);
  const Tensor w3 = RandomNormal({e, f, l}, DType::kF64, rng, 0.5);
  const Tensor w2 = RandomNormal({e, l, f}, DType::kF64, rng, 0.5);
  std::vector<RankData> data(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const int64_t n = tokens[static_cast<size_t>(r)];
    data[r].xl = RandomNormal({n, l}, DType::kF64, rng);
    data[r].ids = RandomIds(n, k, e, rng);
    data[r].weights = RandomNormal({n, k}, DType::kF64, rng);
    data[r].dy = RandomNormal({n, l}, DType::kF64, rng);
  }
  // The oracle: all experts on every rank.
  std::vector<Tensor> y_ref(world), dxl_ref(world), dwt_ref(world);
  Tensor dw1_sum = Tensor::Zeros(w1.shape(), DType::kF64), dw3_sum = dw1_sum.Clone();
  Tensor dw2_sum = Tensor::Zeros(w2.shape(), DType::kF64);
  for (int r = 0; r < world; ++r) {
    const RankData& d = data[r];
    MoeExpertsSaved saved;
    ASSERT_TRUE(MoeExperts(d.xl, d.ids, d.weights, w1, w3, w2, act, &y_ref[r], &saved).ok());
    dxl_ref[r] = Tensor::Zeros(d.xl.shape(), DType::kF64);
    const Status st = MoeExpertsGrad(d.xl, d.ids, d.weights, w1, w3, w2, act, saved, d.dy,
                                     &dxl_ref[r], &dwt_ref[r], &dw1_sum, &dw3_sum, &dw2_sum);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  // Sharded: each rank a thread with its own share of the experts.
  Group group(world, e);
  std::vector<Tensor> y(world), dxl(world), dwt(world), dw1(world), dw3(world), dw2(world);
  std::vector<Status> status(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      ThreadExchange exchange(&group, r);
      MoeExpertsOptions options;
      options.exchange = &exchange;
      const int64_t le = exchange.local_experts(), first = exchange.first_expert();
      const Tensor w1l = ExpertsSlice(w1, first, le), w3l = ExpertsSlice(w3, first, le);
      const Tensor w2l = ExpertsSlice(w2, first, le);
      const RankData& d = data[r];
      MoeExpertsSaved saved;
      Status st = MoeExperts(d.xl, d.ids, d.weights, w1l, w3l, w2l, act, &y[r], &saved, options);
      if (st.ok()) {
        st = MoeExpertsGrad(d.xl, d.ids, d.weights, w1l, w3l, w2l, act, saved, d.dy, &dxl[r],
                            &dwt[r], &dw1[r], &dw3[r], &dw2[r], options);
      }
      status[r] = st;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r].ToString();
    if (tokens[r] > 0) {
      EXPECT_LT(RelRmsError(y[r], y_ref[r]), 1e-13) << "rank " << r;
      EXPECT_LT(RelRmsError(dxl[r], dxl_ref[r]), 1e-13) << "rank " << r;
      EXPECT_LT(RelRmsError(dwt[r], dwt_ref[r]), 1e-13) << "rank " << r;
    }
    const int64_t le = e / world, first = r * le;
    EXPECT_LT(RelRmsError(dw1[r], ExpertsSlice(dw1_sum, first, le)), 1e-13) << "rank " << r;
    EXPECT_LT(RelRmsError(dw3[r], ExpertsSlice(dw3_sum, first, le)), 1e-13) << "rank " << r;
    EXPECT_LT(RelRmsError(dw2[r], ExpertsSlice(dw2_sum, first, le)), 1e-13) << "rank " << r;
  }
}

TEST(ExpertExchangeTest, TwoRanksMatchAllExpertsOnEveryRank) { RunGroup({11, 7}); }

TEST(ExpertExchangeTest, FourRanksOneWithoutTokensStillServesItsExperts) {
  RunGroup({9, 0, 13, 5});
}

TEST(ExpertExchangeTest, LocalWeightsMustMatchTheExchangesShare) {
  Group group(2, 6);
  ThreadExchange exchange(&group, 0);
  MoeExpertsOptions options;
  options.exchange = &exchange;
  PhiloxGenerator rng(5, 0);
  const Tensor xl = RandomNormal({4, 8}, DType::kF64, rng);
  const Tensor w1 = RandomNormal({6, 12, 8}, DType::kF64, rng);  // all 6, not rank 0's 3
  const Tensor w2 = RandomNormal({6, 8, 12}, DType::kF64, rng);
  const Tensor ids = RandomIds(4, 2, 6, rng), weights = RandomNormal({4, 2}, DType::kF64, rng);
  Tensor y;
  const Status st = MoeExperts(xl, ids, weights, w1, w1, w2, GluActivation{}, &y, nullptr, options);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("the exchange holds experts [0, 3) of 6"), std::string::npos)
      << st.ToString();
}

}  // namespace
}  // namespace orrery::kernels
