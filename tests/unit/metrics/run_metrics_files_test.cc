#include "actors/metrics/run_metrics_files.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "actors/metrics/metrics_export.h"
#include "tests/fixtures/metrics_run_generator.h"
#include "tests/unit/metrics/test_dir.h"

namespace orrery {
namespace {

void Append(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::app | std::ios::binary);
  out << text;
}

TEST(RunMetricsTailerTest, ReadsCompleteLinesOnlyAndFollowsGrowth) {
  TestDir dir;
  std::filesystem::create_directories(dir / "rollout0");
  Append(dir / "metrics.jsonl",
         R"({"time":1,"source":"learner:0","step":1,"metrics":{"learner/loss":2}})"
         "\n"
         R"({"time":2,"source":"learner:0","step":2,"metr)");  // torn last line
  Append(dir / "rollout0/metrics.jsonl", "this is not json\n");
  RunMetricsTailer tailer(dir.path());
  std::vector<MetricRecord> records;
  ASSERT_TRUE(tailer.Poll(&records).ok());
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].step, 1);
  EXPECT_EQ(tailer.malformed_lines(), 1);

  Append(dir / "metrics.jsonl", R"(ics":{"learner/loss":1.5}})"
                                "\n");
  Append(dir / "rollout0/metrics.jsonl",
         R"({"time":3,"source":"rollout:0","step":2,"metrics":{"reward/mean":0.5}})"
         "\n");
  records.clear();
  ASSERT_TRUE(tailer.Poll(&records).ok());
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].step, 2);  // the completed line
  EXPECT_DOUBLE_EQ(records[0].scalars.at("learner/loss"), 1.5);
  EXPECT_EQ(records[1].source, "rollout:0");
  records.clear();
  ASSERT_TRUE(tailer.Poll(&records).ok());
  EXPECT_TRUE(records.empty());
}

TEST(RunMetricsFilesTest, MissingRunIsAClearError) {
  auto files = FindRunMetricsFiles("/nonexistent/run");
  ASSERT_FALSE(files.ok());
  EXPECT_NE(files.status().message().find("/nonexistent/run"), std::string::npos);
  TestDir empty;
  auto records = ReadRunMetrics(empty.path());
  ASSERT_FALSE(records.ok());
  EXPECT_NE(records.status().message().find("no metrics.jsonl"), std::string::npos);
}

// An RL-only run: no RUN/metrics.jsonl, sub-directories without one (rl/, replay/), the actors'
// files and the launcher's fleet_metrics.jsonl. Whatever the listing order, every file is found.
TEST(RunMetricsFilesTest, ReadsAnRlOnlyRunAndTheFleetMetrics) {
  TestDir dir;
  for (const char* d : {"rl/weights", "replay/db", "fleet", "learner-0", "rollout-0", "zz"}) {
    std::filesystem::create_directories(dir / d);
  }
  Append(dir / "learner-0/metrics.jsonl",
         R"({"time":2,"source":"learner:0","step":1,"metrics":{"learner/loss":2}})"
         "\n");
  Append(dir / "rollout-0/metrics.jsonl",
         R"({"time":1,"source":"rollout:0","step":1,"metrics":{"reward/mean":0.5}})"
         "\n");
  Append(dir / "fleet_metrics.jsonl",
         R"({"time":3,"source":"coordinator","step":0,"metrics":{"fleet/restarts_total":1}})"
         "\n");
  auto files = FindRunMetricsFiles(dir.path());
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  EXPECT_EQ(*files,
            (std::vector<std::string>{dir / "fleet_metrics.jsonl", dir / "learner-0/metrics.jsonl",
                                      dir / "rollout-0/metrics.jsonl"}));
  auto records = ReadRunMetrics(dir.path());
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  ASSERT_EQ(records->size(), 3u);
  EXPECT_EQ((*records)[2].source, "coordinator");

  // A sub-directory without metrics.jsonl listed last does not fail the listing either.
  TestDir one;
  Append(one / "metrics.jsonl", R"({"time":1,"source":"a","step":1,"metrics":{"x":1}})"
                                "\n");
  std::filesystem::create_directories(one / "rl");
  auto single = FindRunMetricsFiles(one.path());
  ASSERT_TRUE(single.ok()) << single.status().ToString();
  EXPECT_EQ(single->size(), 1u);
}

TEST(RunMetricsFilesTest, SaysWhetherThePathDoesNotExistOrIsNotADirectory) {
  auto missing = FindRunMetricsFiles("/nonexistent/run");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(),
            "/nonexistent/run: does not exist (expected a run directory with metrics.jsonl)");
  TestDir dir;
  Append(dir / "file", "x");
  auto file = FindRunMetricsFiles(dir / "file");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().message(),
            dir / "file" + ": is not a directory (expected a run directory with metrics.jsonl)");
}

TEST(MetricsExportTest, CsvHasOneRowPerValueAndJsonlRoundTrips) {
  MetricRecord r;
  r.time = 12.5;
  r.source = "learner:0";
  r.step = 3;
  r.scalars["learner/loss"] = 0.25;
  r.vectors["learner/staleness_by_version"] = {4, 2};
  MetricRecord quoted = r;
  quoted.source = "odd,\"name\"";
  quoted.vectors.clear();

  std::ostringstream csv;
  ASSERT_TRUE(WriteExport({r, quoted}, ExportFormat::kCsv, csv).ok());
  EXPECT_EQ(csv.str(),
            "time,source,step,metric,index,value\n"
            "12.5,learner:0,3,learner/loss,,0.25\n"
            "12.5,learner:0,3,learner/staleness_by_version,0,4\n"
            "12.5,learner:0,3,learner/staleness_by_version,1,2\n"
            "12.5,\"odd,\"\"name\"\"\",3,learner/loss,,0.25\n");

  std::ostringstream jsonl;
  ASSERT_TRUE(WriteExport({r}, ExportFormat::kJsonl, jsonl).ok());
  auto back = MetricRecord::FromJson(jsonl.str().substr(0, jsonl.str().size() - 1));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->vectors.at("learner/staleness_by_version"), (std::vector<double>{4, 2}));

  EXPECT_TRUE(ParseExportFormat("csv").ok());
  auto bad = ParseExportFormat("xlsx");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("csv or jsonl"), std::string::npos);
}

// The committed fixture is exactly what the generator writes (regenerate it with
// make_metrics_fixture after changing the generator).
TEST(MetricsFixtureTest, CommittedFixtureMatchesTheGenerator) {
  const char* src = std::getenv("ORRERY_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "ORRERY_SOURCE_DIR is set by CTest";
  const std::string path = std::string(src) + "/tests/fixtures/metrics_run/metrics.jsonl";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::ostringstream committed;
  committed << in.rdbuf();
  std::string generated;
  for (const MetricRecord& r : GenerateMetricsRun()) generated += r.ToJson() + "\n";
  EXPECT_TRUE(committed.str() == generated)
      << "tests/fixtures/metrics_run/metrics.jsonl is out of date: run make_metrics_fixture";

  // And it exercises what the dashboard draws: 5 actors, 4 layers x 16 experts.
  auto records = ReadRunMetrics(std::string(src) + "/tests/fixtures/metrics_run");
  ASSERT_TRUE(records.ok());
  std::set<std::string> sources;
  for (const MetricRecord& r : *records) sources.insert(r.source);
  EXPECT_EQ(sources.size(), 5u);
  EXPECT_EQ(records->back().step, MetricsFixtureShape().steps - 1);
}

}  // namespace
}  // namespace orrery
