#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "core/chat.h"
#include "core/metrics.h"

namespace orrery {
namespace {

TEST(ChatTest, JsonRoundTrip) {
  ChatMessage a{
      ChatRole::kAssistant, "", {{"call_0", "calculate", R"({"expression":"2+3"})"}}, "", ""};
  ChatMessage t{ChatRole::kTool, "5", {}, "call_0", "calculate"};
  std::string json = ChatMessagesToJson({a, t});
  StatusOr<std::vector<ChatMessage>> back = ChatMessagesFromJson(json);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].tool_calls[0].name, "calculate");
  EXPECT_EQ((*back)[0].tool_calls[0].arguments_json, R"({"expression":"2+3"})");
  EXPECT_EQ((*back)[1].tool_call_id, "call_0");
  EXPECT_EQ((*back)[1].role, ChatRole::kTool);
  EXPECT_FALSE(ChatMessageFromJson(R"({"role":"robot"})").ok());
  EXPECT_FALSE(ChatMessageFromJson("{").ok());
  EXPECT_FALSE(ChatMessagesFromJson(R"({"role":"user"})").ok());
}

TEST(MetricsTest, RecordsRoundTripAndTornLinesAreSkipped) {
  MetricRecord r;
  r.time = 1.5;
  r.source = "learner:0";
  r.step = 7;
  r.scalars["loss"] = 2.25;
  r.vectors["expert_load/layer1"] = {0.5, 1.5};
  std::string path = testing::TempDir() + "/metrics_test.jsonl";
  std::remove(path.c_str());
  {
    auto w = MetricsFileWriter::Open(path);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Write(r).ok());
    ASSERT_TRUE((*w)->Write(r).ok());
  }
  std::ofstream(path, std::ios::app) << "{\"time\": 3, \"metr";  // a crash mid-line
  int skipped = 0;
  auto records = ReadMetricsFile(path, &skipped);
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 2u);
  EXPECT_EQ(skipped, 1);
  EXPECT_EQ((*records)[1].step, 7);
  EXPECT_EQ((*records)[1].source, "learner:0");
  EXPECT_DOUBLE_EQ((*records)[1].scalars.at("loss"), 2.25);
  EXPECT_EQ((*records)[1].vectors.at("expert_load/layer1"), (std::vector<double>{0.5, 1.5}));
  EXPECT_FALSE(MetricRecord::FromJson(R"({"metrics": {"x": "text"}})").ok());
}

}  // namespace
}  // namespace orrery
