#include "env/retrieval/retrieval_env.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace orrery::env {
namespace {

// Plays an episode the way a model should: search the question's subject, read around the hit,
// answer with the number found.
double Play(size_t doc_tokens, uint64_t index, std::string* document_size) {
  RetrievalEnvOptions o;
  o.doc_tokens = static_cast<int64_t>(doc_tokens);
  std::unique_ptr<Env> env = MakeRetrievalEnv(o);
  std::unique_ptr<Episode> e =
      std::move(*env->Reset(*env->Task(Split::kTrain, index), DeadlineIn(30)));
  const std::string q = e->initial_messages()[1].content;  // "What is the X of the Y Z?"
  const std::string subject = "The " + q.substr(12, q.size() - 13) + " is ";
  StatusOr<ToolResult> hits =
      e->Step(ToolCall{"c0", "search", nlohmann::json{{"query", subject}}.dump()}, DeadlineIn(5));
  EXPECT_TRUE(hits.ok());
  EXPECT_EQ(hits->content.rfind("offset ", 0), 0u) << hits->content;
  const size_t offset = std::stoul(hits->content.substr(7));
  StatusOr<ToolResult> text =
      e->Step(ToolCall{"c1", "read",
                       nlohmann::json{{"offset", offset + subject.size()}, {"length", 4}}.dump()},
              DeadlineIn(5));
  EXPECT_FALSE(text->is_error);
  std::vector<ChatMessage> t = e->initial_messages();
  t.push_back(ChatMessage{ChatRole::kAssistant, "Answer: " + text->content, {}, "", ""});
  *document_size = e->initial_messages()[0].content;
  return e->Score(t, DeadlineIn(5))->reward;
}

TEST(RetrievalEnvTest, SearchReadAnswer) {
  std::string info;
  for (uint64_t i = 0; i < 5; ++i) EXPECT_EQ(Play(1000, i, &info), 1.0);
}

TEST(RetrievalEnvTest, MillionTokenDocument) {
  StatusOr<RetrievalTask> t =
      MakeRetrievalTask(RetrievalEnvOptions{0, 1'000'000, 8, 4096}, Split::kTest, 0);
  ASSERT_TRUE(t.ok());
  EXPECT_GT(t->document.size(), 4'000'000u);
  EXPECT_EQ(t->document.substr(t->answer_offset).find(t->answer),
            t->document.substr(t->answer_offset).find(" is ") + 4);
  std::string info;
  EXPECT_EQ(Play(1'000'000, 1, &info), 1.0);
}

TEST(RetrievalEnvTest, DeterministicAndValidated) {
  RetrievalEnvOptions o;
  EXPECT_EQ(MakeRetrievalTask(o, Split::kTrain, 3)->document,
            MakeRetrievalTask(o, Split::kTrain, 3)->document);
  EXPECT_NE(MakeRetrievalTask(o, Split::kTrain, 3)->document,
            MakeRetrievalTask(o, Split::kTest, 3)->document);
  o.doc_tokens = 10;
  EXPECT_FALSE(MakeRetrievalTask(o, Split::kTrain, 0).ok());
  std::unique_ptr<Env> env = MakeRetrievalEnv({});
  std::unique_ptr<Episode> e = std::move(*env->Reset(*env->Task(Split::kTrain, 0), DeadlineIn(5)));
  EXPECT_TRUE(e->Step(ToolCall{"c", "read", R"({"offset": 0, "length": 100000})"}, DeadlineIn(5))
                  ->is_error);
  EXPECT_TRUE(
      e->Step(ToolCall{"c", "read", R"({"offset": 999999999, "length": 10})"}, DeadlineIn(5))
          ->is_error);
  EXPECT_EQ(e->Step(ToolCall{"c", "search", R"({"query": "zzzz"})"}, DeadlineIn(5))->content,
            "no matches");
  std::vector<ChatMessage> t = e->initial_messages();
  t.push_back(ChatMessage{ChatRole::kAssistant, "Answer: 0", {}, "", ""});
  EXPECT_EQ(e->Score(t, DeadlineIn(5))->reward, 0.0);
}

}  // namespace
}  // namespace orrery::env
