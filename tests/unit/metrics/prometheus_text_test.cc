#include "actors/metrics/prometheus_text.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "tests/fixtures/metrics_run_generator.h"
#include "tests/unit/metrics/test_dir.h"

namespace orrery {
namespace {

using Labels = std::vector<std::pair<std::string, std::string>>;

TEST(PrometheusNameTest, FollowsTheNamingRules) {
  auto loss = ToPrometheusName("learner/loss");
  ASSERT_TRUE(loss.ok());
  EXPECT_EQ(loss->name, "orrery_learner_loss");
  EXPECT_TRUE(loss->labels.empty());
  EXPECT_FALSE(loss->counter);

  auto load = ToPrometheusName("routing/expert_load/layer12");
  ASSERT_TRUE(load.ok());
  EXPECT_EQ(load->name, "orrery_routing_expert_load");
  EXPECT_EQ(load->labels, (Labels{{"layer", "12"}}));

  // A keyed pair keeps its key in the name: reward/env/calc/mean and reward/mean are two
  // families, so that a sum() over one does not count the other.
  auto env = ToPrometheusName("reward/env/calc/pass_rate");
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->name, "orrery_reward_env_pass_rate");
  EXPECT_EQ(env->labels, (Labels{{"env", "calc"}}));
  auto all_envs = ToPrometheusName("reward/pass_rate");
  ASSERT_TRUE(all_envs.ok());
  EXPECT_EQ(all_envs->name, "orrery_reward_pass_rate");

  auto blocked = ToPrometheusName("replay/table/trajectories/blocked_seconds_total");
  ASSERT_TRUE(blocked.ok());
  EXPECT_EQ(blocked->name, "orrery_replay_table_blocked_seconds_total");
  EXPECT_EQ(blocked->labels, (Labels{{"table", "trajectories"}}));
  EXPECT_TRUE(blocked->counter);

  auto phase = ToPrometheusName("learner/weight_sync_seconds/phase/gather");
  ASSERT_TRUE(phase.ok());
  EXPECT_EQ(phase->name, "orrery_learner_weight_sync_seconds_phase");
  EXPECT_EQ(phase->labels, (Labels{{"phase", "gather"}}));

  auto odd = ToPrometheusName("Rollout/tokens-per.second");
  ASSERT_TRUE(odd.ok());
  EXPECT_EQ(odd->name, "orrery_rollout_tokens_per_second");

  // "layer" alone is a word, not a label; a second layer segment stays in the name.
  auto twice = ToPrometheusName("x/layer/layer1/layer2");
  ASSERT_TRUE(twice.ok());
  EXPECT_EQ(twice->name, "orrery_x_layer_layer2");
  EXPECT_EQ(twice->labels, (Labels{{"layer", "1"}}));

  EXPECT_FALSE(ToPrometheusName("layer3").ok());
  EXPECT_FALSE(ToPrometheusName("//").ok());
}

std::unique_ptr<MetricsStore> FixtureStore() {
  MetricsStoreOptions options;
  options.in_memory = true;
  auto store = MetricsStore::Open("/prometheus-test", options);
  EXPECT_TRUE(store.ok());
  MetricsFixtureShape shape;
  shape.steps = 5;
  for (const MetricRecord& r : GenerateMetricsRun(shape)) EXPECT_TRUE((*store)->Append(r).ok());
  return std::move(store).value();
}

TEST(PrometheusTextTest, RendersLatestValuesWithTypesAndLabels) {
  auto store = FixtureStore();
  IngestCounters counters;
  counters.received = 42;
  const std::string text = RenderPrometheusText(*store, &counters);
  EXPECT_NE(text.find("# TYPE orrery_learner_loss gauge"), std::string::npos);
  EXPECT_NE(text.find("orrery_learner_loss{actor=\"learner:0\"}"), std::string::npos);
  EXPECT_NE(text.find("# TYPE orrery_replay_table_blocked_seconds_total counter"),
            std::string::npos);
  EXPECT_NE(text.find("orrery_routing_expert_load{layer=\"3\",actor=\"learner:0\",index=\"15\"}"),
            std::string::npos)
      << text.substr(0, 2000);
  EXPECT_NE(text.find("orrery_reward_env_mean{env=\"calc\",actor=\"rollout:1\"}"),
            std::string::npos);
  EXPECT_NE(text.find("orrery_reward_mean{actor=\"rollout:1\"}"), std::string::npos);
  EXPECT_NE(text.find("orrery_metrics_hub_records_received_total 42"), std::string::npos);
  EXPECT_NE(text.find("orrery_actor_last_heartbeat_timestamp_seconds{actor=\"replay:0\"}"),
            std::string::npos);
  // The step-4 value of learner/loss is the one exported.
  auto q = store->Query("learner/loss");
  ASSERT_TRUE(q.ok());
  const double last = (*q)[0].points.back().values[0];
  const std::string key = "orrery_learner_loss{actor=\"learner:0\"} ";
  const size_t at = text.find(key);
  ASSERT_NE(at, std::string::npos);
  EXPECT_DOUBLE_EQ(std::strtod(text.c_str() + at + key.size(), nullptr), last);
}

// Every sample of a family has the same label names: the fixture has reward/mean and
// reward/env/<env>/mean, which must not share a family (a sum() would count each reward twice).
TEST(PrometheusTextTest, EachFamilyHasOneLabelSet) {
  auto store = FixtureStore();
  std::istringstream text(RenderPrometheusText(*store, nullptr));
  std::map<std::string, std::set<std::string>> label_names;  // family -> "k1,k2" per sample
  std::string line;
  while (std::getline(text, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t brace = line.find('{');
    const size_t space = line.find(' ');
    const std::string name = line.substr(0, std::min(brace, space));
    std::string keys;
    if (brace < space) {
      const std::string labels = line.substr(brace + 1, line.find('}') - brace - 1);
      for (size_t at = 0; at < labels.size();) {
        const size_t eq = labels.find('=', at);
        keys += labels.substr(at, eq - at) + ",";
        const size_t close = labels.find('"', labels.find('"', eq) + 1);
        at = close + 2;  // past '",'
      }
    }
    label_names[name].insert(keys);
  }
  ASSERT_TRUE(label_names.count("orrery_reward_mean"));
  for (const auto& [name, sets] : label_names) {
    EXPECT_EQ(sets.size(), 1u) << name << " has samples with different label names";
  }
}

// promtool (Debian's prometheus package) is the independent judge of the exposition format and
// of the naming conventions.
TEST(PrometheusTextTest, PromtoolAcceptsTheExposition) {
  const char* promtool = "/usr/bin/promtool";
  if (!std::filesystem::exists(promtool)) GTEST_SKIP() << "promtool not installed";
  auto store = FixtureStore();
  IngestCounters counters;
  TestDir dir;
  {
    std::ofstream out(dir / "metrics.txt");
    out << RenderPrometheusText(*store, &counters);
  }
  const std::string cmd = std::string(promtool) + " check metrics < " + (dir / "metrics.txt") +
                          " > " + (dir / "promtool.out") + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(dir / "promtool.out");
  std::string report((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << report;
  EXPECT_TRUE(report.empty()) << report;  // lint problems are printed even on success
}

}  // namespace
}  // namespace orrery
