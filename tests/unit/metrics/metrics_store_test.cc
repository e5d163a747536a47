#include "actors/metrics/metrics_store.h"

#include <gtest/gtest.h>

#include "tests/unit/metrics/test_dir.h"

namespace orrery {
namespace {

MetricRecord Rec(const std::string& source, int64_t step, double time, double loss) {
  MetricRecord r;
  r.source = source;
  r.step = step;
  r.time = time;
  r.scalars["learner/loss"] = loss;
  r.vectors["routing/expert_load/layer0"] = {loss, 2 * loss, 3 * loss};
  return r;
}

TEST(MetricsStoreTest, AppendsAndQueriesPerSource) {
  TestDir dir;
  auto store = MetricsStore::Open(dir / "db");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ASSERT_TRUE((*store)->Append(Rec("learner:0", 1, 100.0, 2.5)).ok());
  ASSERT_TRUE((*store)->Append(Rec("learner:1", 1, 100.5, 2.6)).ok());
  ASSERT_TRUE((*store)->Append(Rec("learner:0", 2, 101.0, 2.4)).ok());
  EXPECT_EQ((*store)->last_seq(), 3u);
  EXPECT_EQ((*store)->records(), 3u);

  auto q = (*store)->Query("learner/loss");
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  ASSERT_EQ(q->size(), 2u);
  EXPECT_EQ((*q)[0].source, "learner:0");
  ASSERT_EQ((*q)[0].points.size(), 2u);
  EXPECT_EQ((*q)[0].points[0].seq, 1u);
  EXPECT_EQ((*q)[0].points[1].step, 2);
  EXPECT_DOUBLE_EQ((*q)[0].points[1].values[0], 2.4);
  EXPECT_DOUBLE_EQ((*q)[0].points[1].time, 101.0);
  EXPECT_EQ((*q)[1].source, "learner:1");

  auto arr = (*store)->Query("routing/expert_load/layer0");
  ASSERT_TRUE(arr.ok());
  EXPECT_EQ((*arr)[0].points[1].values, (std::vector<double>{2.4, 2 * 2.4, 3 * 2.4}));

  // A prefix of another name is not that name.
  auto none = (*store)->Query("learner/los");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(MetricsStoreTest, QueryAfterSequenceReturnsOnlyNewPoints) {
  TestDir dir;
  auto store = MetricsStore::Open(dir / "db");
  ASSERT_TRUE(store.ok());
  for (int i = 1; i <= 5; ++i) {
    ASSERT_TRUE((*store)->Append(Rec(i % 2 ? "a:0" : "b:0", i, i, i)).ok());
  }
  auto q = (*store)->Query("learner/loss", /*after_seq=*/3);
  ASSERT_TRUE(q.ok());
  ASSERT_EQ(q->size(), 2u);
  EXPECT_EQ((*q)[0].source, "a:0");
  ASSERT_EQ((*q)[0].points.size(), 1u);
  EXPECT_EQ((*q)[0].points[0].seq, 5u);
  EXPECT_EQ((*q)[1].points.size(), 1u);
  EXPECT_EQ((*q)[1].points[0].seq, 4u);
  // Nothing after the last point.
  auto empty = (*store)->Query("learner/loss", 5);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(MetricsStoreTest, ThinsLongSeriesKeepingTheEnds) {
  TestDir dir;
  auto store = MetricsStore::Open(dir / "db");
  ASSERT_TRUE(store.ok());
  for (int i = 0; i < 101; ++i) ASSERT_TRUE((*store)->Append(Rec("a:0", i, i, i)).ok());
  auto q = (*store)->Query("learner/loss", 0, 11);
  ASSERT_TRUE(q.ok());
  ASSERT_EQ((*q)[0].points.size(), 11u);
  EXPECT_EQ((*q)[0].points.front().step, 0);
  EXPECT_EQ((*q)[0].points[5].step, 50);
  EXPECT_EQ((*q)[0].points.back().step, 100);
}

TEST(MetricsStoreTest, SurvivesReopen) {
  TestDir dir;
  {
    auto store = MetricsStore::Open(dir / "db");
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Append(Rec("learner:0", 7, 50.0, 1.5)).ok());
    ASSERT_TRUE((*store)->Append(Rec("rollout:0", 8, 51.0, 1.25)).ok());
  }
  auto store = MetricsStore::Open(dir / "db");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->last_seq(), 2u);
  EXPECT_EQ((*store)->records(), 2u);
  auto series = (*store)->ListSeries();
  ASSERT_EQ(series.size(), 4u);  // 2 names x 2 sources
  EXPECT_EQ(series[0].name, "learner/loss");
  EXPECT_EQ(series[0].source, "learner:0");
  EXPECT_FALSE(series[0].is_array);
  EXPECT_EQ(series[0].last.step, 7);
  EXPECT_TRUE(series[2].is_array);
  auto sources = (*store)->ListSources();
  ASSERT_EQ(sources.size(), 2u);
  EXPECT_EQ(sources[1].source, "rollout:0");
  EXPECT_DOUBLE_EQ(sources[1].last_time, 51.0);
  // Sequence numbers continue after a restart.
  ASSERT_TRUE((*store)->Append(Rec("learner:0", 9, 52.0, 1.0)).ok());
  EXPECT_EQ((*store)->last_seq(), 3u);
  std::vector<uint64_t> seqs;
  ASSERT_TRUE((*store)
                  ->ForEachRecord([&](uint64_t seq, const MetricRecord& r) {
                    seqs.push_back(seq);
                    EXPECT_FALSE(r.source.empty());
                    return Status::OK();
                  })
                  .ok());
  EXPECT_EQ(seqs, (std::vector<uint64_t>{1, 2, 3}));
}

TEST(MetricsStoreTest, InMemoryStoreWritesNothingToDisk) {
  MetricsStoreOptions options;
  options.in_memory = true;
  const std::string path = "/orrery-metrics-in-memory-test";
  auto store = MetricsStore::Open(path, options);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ASSERT_TRUE((*store)->Append(Rec("a:0", 1, 1, 1)).ok());
  EXPECT_EQ((*store)->Query("learner/loss")->size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(MetricsStoreTest, RejectsRecordsWithoutSourceOrMetrics) {
  TestDir dir;
  auto store = MetricsStore::Open(dir / "db");
  ASSERT_TRUE(store.ok());
  MetricRecord no_source = Rec("", 1, 1, 1);
  EXPECT_EQ((*store)->Append(no_source).code(), StatusCode::kInvalidArgument);
  MetricRecord empty;
  empty.source = "a:0";
  EXPECT_EQ((*store)->Append(empty).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->last_seq(), 0u);
}

TEST(MetricsStoreTest, OpenFailsOnAFileInsteadOfADirectory) {
  TestDir dir;
  std::FILE* f = std::fopen((dir / "file").c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  auto store = MetricsStore::Open(dir / "file");
  EXPECT_FALSE(store.ok());
}

}  // namespace
}  // namespace orrery
