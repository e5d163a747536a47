#include "env/retrieval/retrieval_env.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <set>

#include "core/config.h"

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

// The in-prompt mode (the long-context RL episode): the user turn carries the document and then
// the question, there are no tools, and the answer is graded as in the tool mode.
RetrievalEnvOptions InPrompt(int64_t words, int64_t words_max = 0) {
  RetrievalEnvOptions o;
  o.document = RetrievalDocument::kInPrompt;
  o.doc_tokens = words;
  o.doc_tokens_max = words_max;
  return o;
}

double ScoreAnswer(Episode& e, const std::string& content) {
  std::vector<ChatMessage> t = e.initial_messages();
  t.push_back(ChatMessage{ChatRole::kAssistant, content, {}, "", ""});
  return e.Score(t, DeadlineIn(5))->reward;
}

TEST(RetrievalEnvTest, InPromptCarriesDocumentAndQuestion) {
  const RetrievalEnvOptions o = InPrompt(3000);
  std::unique_ptr<Env> env = MakeRetrievalEnv(o);
  for (uint64_t i = 0; i < 4; ++i) {
    const TaskRef ref = *env->Task(Split::kTrain, i);
    EXPECT_EQ(ref.id.rfind("retrieval/in_prompt/train/3000/0/", 0), 0u) << ref.id;
    StatusOr<RetrievalTask> task = MakeRetrievalTask(o, Split::kTrain, i);
    ASSERT_TRUE(task.ok());
    EXPECT_EQ(task->doc_words, 3000);
    std::unique_ptr<Episode> e = std::move(*env->Reset(ref, DeadlineIn(30)));
    EXPECT_TRUE(e->tools().empty());
    ASSERT_EQ(e->initial_messages().size(), 2u);
    const std::string& user = e->initial_messages()[1].content;
    EXPECT_NE(user.find(task->document), std::string::npos);
    EXPECT_GT(user.find(task->question), user.find(task->document));  // the question comes last
    // The planted fact is in the prompt: the needle is readable, not hidden.
    EXPECT_EQ(task->document.substr(task->answer_offset).find(task->answer),
              task->document.substr(task->answer_offset).find(" is ") + 4);
    EXPECT_TRUE(e->Step(ToolCall{"c", "search", R"({"query": "x"})"}, DeadlineIn(5))->is_error);
    EXPECT_EQ(ScoreAnswer(*e, "Answer: " + task->answer), 1.0);
    EXPECT_EQ(ScoreAnswer(*e, "The value is there.\nAnswer:  " + task->answer + " "), 1.0);
    EXPECT_EQ(ScoreAnswer(*e, "Answer: " + task->answer + "0"), 0.0);
    EXPECT_EQ(ScoreAnswer(*e, task->answer), 0.0);  // no answer line
    std::vector<ChatMessage> t = e->initial_messages();
    t.push_back(ChatMessage{ChatRole::kAssistant, "Answer: " + task->answer, {}, "", ""});
    StatusOr<EpisodeScore> s = e->Score(t, DeadlineIn(5));
    EXPECT_EQ(s->components.at("doc_words"), 3000.0);
    EXPECT_GE(s->components.at("depth"), 0.0);
    EXPECT_LT(s->components.at("depth"), 1.0);
  }
}

// The in-prompt grader against a policy that games it: every planted value is in the prompt, so
// listing them all as answer lines, hiding the value among others on the line, invalid bytes, a
// flood of text and tool calls of any shape must earn nothing (and break nothing).
TEST(RetrievalEnvTest, InPromptAnswerCannotBeGuessedByListingTheDocumentsValues) {
  const RetrievalEnvOptions o = InPrompt(3000);
  std::unique_ptr<Env> env = MakeRetrievalEnv(o);
  const TaskRef ref = *env->Task(Split::kTrain, 2);
  StatusOr<RetrievalTask> task = MakeRetrievalTask(o, Split::kTrain, 2);
  ASSERT_TRUE(task.ok());
  std::unique_ptr<Episode> e = std::move(*env->Reset(ref, DeadlineIn(30)));
  // Every fact's value ("... is 4821."), as a policy that reads the prompt would collect them.
  std::vector<std::string> values;
  for (size_t at = task->document.find(" is "); at != std::string::npos;
       at = task->document.find(" is ", at + 1)) {
    const std::string v = task->document.substr(at + 4, 4);
    if (v.size() == 4 && std::all_of(v.begin(), v.end(), ::isdigit)) values.push_back(v);
  }
  ASSERT_GE(values.size(), 2u);
  std::string listed = "Answer: " + task->answer + "\n";
  std::string same_line = "Answer:";
  for (const std::string& v : values) {
    if (v != task->answer) listed += "Answer: " + v + "\n";
    same_line += " " + v;
  }
  EXPECT_EQ(ScoreAnswer(*e, listed), 0.0) << "the last answer line counts, not any of them";
  EXPECT_EQ(ScoreAnswer(*e, same_line), 0.0);
  EXPECT_EQ(ScoreAnswer(*e, "Answer: " + task->answer + " or " + values[0]), 0.0);
  EXPECT_EQ(ScoreAnswer(*e, std::string("Answer: \xff\xfe\0", 11) + task->answer), 0.0);
  std::string flood;
  while (flood.size() < (4u << 20)) flood += "Answer: " + task->answer + "\n" + "Answer: 0\n";
  EXPECT_EQ(ScoreAnswer(*e, flood), 0.0);
  for (const char* args : {R"({"query": 5})", "{", "\xff", R"([1, 2])", ""}) {
    StatusOr<ToolResult> r = e->Step(ToolCall{"c", "read", args}, DeadlineIn(5));
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->is_error) << args;
  }
  EXPECT_EQ(ScoreAnswer(*e, "Answer: " + task->answer), 1.0) << "the episode still grades";
}

TEST(RetrievalEnvTest, LengthRangeAndDepthsAreDrawnPerTaskAndDeterministic) {
  const RetrievalEnvOptions o = InPrompt(1000, 4000);
  std::set<int64_t> lengths;
  double min_depth = 1, max_depth = 0;
  for (uint64_t i = 0; i < 40; ++i) {
    StatusOr<RetrievalTask> a = MakeRetrievalTask(o, Split::kTrain, i);
    ASSERT_TRUE(a.ok());
    EXPECT_GE(a->doc_words, 1000);
    EXPECT_LE(a->doc_words, 4000);
    lengths.insert(a->doc_words);
    const double depth = static_cast<double>(a->answer_offset) / a->document.size();
    min_depth = std::min(min_depth, depth);
    max_depth = std::max(max_depth, depth);
    StatusOr<RetrievalTask> b = MakeRetrievalTask(o, Split::kTrain, i);
    EXPECT_EQ(a->document, b->document);
    EXPECT_EQ(a->question, b->question);
    EXPECT_EQ(a->answer, b->answer);
  }
  EXPECT_GT(lengths.size(), 30u);
  EXPECT_LT(min_depth, 0.25);
  EXPECT_GT(max_depth, 0.75);
  RetrievalEnvOptions other = o;
  other.seed = 1;
  EXPECT_NE(MakeRetrievalTask(o, Split::kTrain, 0)->document,
            MakeRetrievalTask(other, Split::kTrain, 0)->document);
  // A fixed length draws nothing: the tool mode's documents are those of before the range.
  RetrievalEnvOptions fixed;
  fixed.doc_tokens = 2000;
  RetrievalEnvOptions same = fixed;
  same.doc_tokens_max = 2000;
  EXPECT_EQ(MakeRetrievalTask(fixed, Split::kTest, 5)->doc_words, 2000);
  EXPECT_EQ(MakeRetrievalTask(same, Split::kTest, 5)->document,
            MakeRetrievalTask(fixed, Split::kTest, 5)->document);
}

TEST(RetrievalEnvTest, HeldOutSplitIsDisjoint) {
  const RetrievalEnvOptions o = InPrompt(1000, 2000);
  std::unique_ptr<Env> env = MakeRetrievalEnv(o);
  std::set<std::string> train_docs, train_ids;
  for (uint64_t i = 0; i < 64; ++i) {
    train_docs.insert(MakeRetrievalTask(o, Split::kTrain, i)->document);
    train_ids.insert(env->Task(Split::kTrain, i)->id);
  }
  for (uint64_t i = 0; i < 64; ++i) {
    EXPECT_EQ(train_docs.count(MakeRetrievalTask(o, Split::kTest, i)->document), 0u) << i;
    EXPECT_EQ(train_ids.count(env->Task(Split::kTest, i)->id), 0u) << i;
  }
}

// Reads [env.retrieval] from TOML text: the options, or the document's first error.
StatusOr<RetrievalEnvOptions> ReadOptions(const std::string& body) {
  StatusOr<ConfigDocument> doc = ConfigDocument::ParseString("[env.retrieval]\n" + body, "t.toml");
  if (!doc.ok()) return doc.status();
  ConfigTable table = doc->root().Table("env").Table("retrieval");
  RetrievalEnvOptions o = ReadRetrievalEnvOptions(table);
  ConfigTable env = doc->root().Table("env");
  (void)env.String("name", "");
  ORRERY_RETURN_IF_ERROR(doc->Finish());
  return o;
}

TEST(RetrievalEnvTest, ConfigIsReadStrictly) {
  StatusOr<RetrievalEnvOptions> o =
      ReadOptions("document = \"in_prompt\"\ndoc_tokens = 131072\ndoc_tokens_max = 1000000\n");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->document, RetrievalDocument::kInPrompt);
  EXPECT_EQ(o->doc_tokens, 131072);
  EXPECT_EQ(o->doc_tokens_max, 1000000);
  EXPECT_EQ(ReadOptions("")->document, RetrievalDocument::kTools);
  const auto error = [](const std::string& body) { return ReadOptions(body).status().ToString(); };
  EXPECT_NE(error("document = \"prompt\"\n").find("env.retrieval.document: expected one of"),
            std::string::npos);
  EXPECT_NE(error("doc_tokens = 5000\ndoc_tokens_max = 4000\n")
                .find("env.retrieval.doc_tokens_max: expected 0 (every document doc_tokens long) "
                      "or at least env.retrieval.doc_tokens = 5000, got 4000"),
            std::string::npos)
      << error("doc_tokens = 5000\ndoc_tokens_max = 4000\n");
  EXPECT_NE(error("doc_tokens_max = 2000000\n").find("env.retrieval.doc_tokens_max"),
            std::string::npos);
  EXPECT_NE(error("doc_tokens = 999\n").find("env.retrieval.doc_tokens"), std::string::npos);
  EXPECT_NE(error("document = \"in_prompt\"\nmax_read_chars = 100\n")
                .find("env.retrieval.max_read_chars: is only read with document = \"tools\""),
            std::string::npos);
  EXPECT_NE(error("doc_token = 5000\n").find("unknown key 'env.retrieval.doc_token'"),
            std::string::npos);
  EXPECT_FALSE(MakeRetrievalTask(InPrompt(5000, 4000), Split::kTrain, 0).ok());
}

}  // namespace
}  // namespace orrery::env
