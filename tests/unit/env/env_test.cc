#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <thread>

#include "env/calc/calc_env.h"
#include "env/calc/one_operation.h"
#include "env/calc/task.h"
#include "env/registry.h"
#include "env/tool_call.h"

namespace orrery::env {
namespace {

std::unique_ptr<Env> Calc() { return calc::MakeCalcEnv(calc::CalcEnvOptions{}); }

ToolCall Call(const std::string& name, const std::string& args) { return {"call_0", name, args}; }

TEST(CalcEnvTest, EpisodeStepAndScore) {
  std::unique_ptr<Env> env = Calc();
  StatusOr<TaskRef> task = env->Task(Split::kTrain, 5);
  ASSERT_TRUE(task.ok());
  StatusOr<std::unique_ptr<Episode>> ep = env->Reset(*task, DeadlineIn(5));
  ASSERT_TRUE(ep.ok());
  Episode& e = **ep;
  ASSERT_EQ(e.tools().size(), 1u);
  EXPECT_NE(e.tools()[0].ToJson().find("\"type\":\"function\""), std::string::npos);
  ASSERT_EQ(e.initial_messages().size(), 2u);
  const calc::CalcTask expected = *calc::MakeCalcTask(0, Split::kTrain, 5, 1 + 5 % 4);
  EXPECT_EQ(e.initial_messages()[1].content, expected.question);

  StatusOr<ToolResult> r =
      e.Step(Call("calculate", "{\"expression\": \"" + expected.expression + "\"}"), DeadlineIn(5));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->is_error);
  EXPECT_EQ(r->content, expected.answer_text);
  EXPECT_GE(r->latency_s, 0);

  std::vector<ChatMessage> traj = e.initial_messages();
  traj.push_back(ChatMessage{ChatRole::kAssistant, "", {Call("calculate", "{}")}, "", ""});
  traj.push_back(ChatMessage{ChatRole::kAssistant, "Answer: " + expected.answer_text, {}, "", ""});
  StatusOr<EpisodeScore> s = e.Score(traj, DeadlineIn(5));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->reward, 1.0);
  EXPECT_EQ(s->components.at("tool_calls"), 1.0);
  traj.back().content = "Answer: 123456789";
  EXPECT_EQ(e.Score(traj, DeadlineIn(5))->reward, 0.0);
}

TEST(CalcEnvTest, ModelMistakesAreErrorResultsNotFailures) {
  std::unique_ptr<Env> env = Calc();
  std::unique_ptr<Episode> e = std::move(*env->Reset(*env->Task(Split::kTrain, 0), DeadlineIn(5)));
  struct Case {
    ToolCall call;
    std::string want;
  } cases[] = {
      {Call("calculate", "{\"expression\": "), "error: arguments are not valid JSON"},
      {Call("calculate", "[1, 2]"), "error: arguments must be a JSON object, got array"},
      {Call("rm_rf", "{}"), "error: unknown tool 'rm_rf' (available: calculate)"},
      {Call("calculate", "{\"expression\": 12}"),
       "error: argument 'expression': expected a string, got integer"},
      {Call("calculate", "{}"), "error: missing required argument 'expression'"},
      {Call("calculate", "{\"expression\": \"1\", \"x\": 1}"),
       "error: unexpected argument 'x' (allowed: expression)"},
      {Call("calculate", "{\"expression\": \"1/0\"}"), "error: division by zero"},
      {Call("calculate", "{\"expression\": \"__import__('os')\"}"), "error: unexpected '_'"},
  };
  for (const Case& c : cases) {
    StatusOr<ToolResult> r = e->Step(c.call, DeadlineIn(5));
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->is_error) << c.call.arguments_json;
    EXPECT_EQ(r->content.rfind(c.want, 0), 0u) << r->content;
  }
}

TEST(CalcEnvTest, ToolCallBudget) {
  calc::CalcEnvOptions o;
  o.max_tool_calls = 2;
  std::unique_ptr<Env> env = calc::MakeCalcEnv(o);
  std::unique_ptr<Episode> e = std::move(*env->Reset(*env->Task(Split::kTest, 0), DeadlineIn(5)));
  for (int i = 0; i < 2; ++i)
    EXPECT_FALSE(e->Step(Call("calculate", "{\"expression\":\"1\"}"), DeadlineIn(5))->is_error);
  EXPECT_TRUE(e->Step(Call("calculate", "{\"expression\":\"1\"}"), DeadlineIn(5))->is_error);
}

// The multi-step family: a whole expression is a tool error the model reads; the operations one
// at a time reach the answer, and the score counts the calls.
TEST(CalcEnvTest, OneOperationToolTakesSeveralSteps) {
  calc::CalcEnvOptions o;
  o.difficulty = 2;
  o.tool = calc::CalcTool::kOneOperation;
  std::unique_ptr<Env> env = calc::MakeCalcEnv(o);
  const TaskRef task = *env->Task(Split::kTest, 3);
  std::unique_ptr<Episode> e = std::move(*env->Reset(task, DeadlineIn(5)));
  EXPECT_NE(e->tools()[0].description.find("one arithmetic operation"), std::string::npos);
  const calc::CalcTask ct = *calc::MakeCalcTask(0, Split::kTest, 3, 2);
  ToolResult whole =
      *e->Step(Call("calculate", "{\"expression\":\"" + ct.expression + "\"}"), DeadlineIn(5));
  EXPECT_TRUE(whole.is_error) << whole.content;
  std::vector<ChatMessage> traj = e->initial_messages();
  ChatMessage answer{ChatRole::kAssistant, "", {}, "", ""};
  const std::vector<calc::OperationStep> steps = *calc::OneOperationSteps(ct.expression);
  for (const calc::OperationStep& step : steps) {
    ToolResult r =
        *e->Step(Call("calculate", "{\"expression\":\"" + step.text + "\"}"), DeadlineIn(5));
    ASSERT_FALSE(r.is_error) << step.text << ": " << r.content;
    EXPECT_EQ(r.content, step.value.ToString());
    traj.push_back(ChatMessage{ChatRole::kAssistant, "", {{"c", "calculate", "{}"}}, "", ""});
    answer.content = "Answer: " + r.content;
  }
  traj.push_back(answer);
  StatusOr<EpisodeScore> score = e->Score(traj, DeadlineIn(5));
  EXPECT_EQ(score->reward, 1.0);
  EXPECT_EQ(score->components.at("tool_calls"), 2.0);
}

// A mix of difficulties: every task gets one of them (by a hash of its index, so that rollout
// instances taking every N-th task still see the mix), its family names it, and its question has
// that difficulty's operand count. Setting difficulty beside the mix is a config error.
TEST(CalcEnvTest, DifficultyMixGivesEachTaskOneOfThemAndItsFamily) {
  calc::CalcEnvOptions o;
  o.difficulties = {2, 3};
  o.tool = calc::CalcTool::kOneOperation;
  std::unique_ptr<Env> env = calc::MakeCalcEnv(o);
  std::map<std::string, int> families, even_families;
  for (uint64_t i = 0; i < 400; ++i) {
    const TaskRef task = *env->Task(Split::kTest, i);
    const std::string family = env->Family(task);
    ASSERT_TRUE(family == "calc/d2" || family == "calc/d3") << family;
    ++families[family];
    if (i % 2 == 0) ++even_families[family];
    const int d = family == "calc/d2" ? 2 : 3;
    EXPECT_EQ(task.id, calc::MakeCalcTask(0, Split::kTest, i, d)->id);
    std::unique_ptr<Episode> e = std::move(*env->Reset(task, DeadlineIn(5)));
    EXPECT_EQ(e->initial_messages()[1].content,
              calc::MakeCalcTask(0, Split::kTest, i, d)->question);
  }
  EXPECT_GT(families["calc/d2"], 150);
  EXPECT_GT(families["calc/d3"], 150);
  EXPECT_GT(even_families["calc/d2"], 60) << "every other task still mixes";
  EXPECT_GT(even_families["calc/d3"], 60);
  EXPECT_EQ(Calc()->Family(*Calc()->Task(Split::kTest, 5)), "calc/d2") << "difficulty 1 + 5 % 4";

  ConfigDocument doc =
      *ConfigDocument::ParseString("[calc]\ndifficulty = 2\ndifficulties = [2, 3]\n", "t.toml");
  ConfigTable t = doc.root().Table("calc");
  (void)calc::ReadCalcEnvOptions(t);
  const Status s = doc.Finish();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("difficulties"), std::string::npos) << s.message();
  doc = *ConfigDocument::ParseString("[calc]\ndifficulties = [2, 5]\n", "t.toml");
  t = doc.root().Table("calc");
  (void)calc::ReadCalcEnvOptions(t);
  EXPECT_FALSE(doc.Finish().ok()) << "difficulty 5 does not exist";
}

TEST(CalcEnvTest, ManyEpisodesInFlight) {
  std::unique_ptr<Env> env = Calc();
  std::atomic<int> correct{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        TaskRef task = *env->Task(Split::kTrain, static_cast<uint64_t>(t * 50 + i));
        std::unique_ptr<Episode> e = std::move(*env->Reset(task, DeadlineIn(5)));
        const calc::CalcTask ct =
            *calc::MakeCalcTask(0, Split::kTrain, task.index, 1 + task.index % 4);
        ToolResult r = *e->Step(Call("calculate", "{\"expression\":\"" + ct.expression + "\"}"),
                                DeadlineIn(5));
        std::vector<ChatMessage> traj = e->initial_messages();
        traj.push_back(ChatMessage{ChatRole::kAssistant, "Answer: " + r.content, {}, "", ""});
        correct += e->Score(traj, DeadlineIn(5))->reward == 1.0;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(correct.load(), 400);
}

TEST(EnvRegistryTest, CreateFromConfigAndErrors) {
  EnvRegistry registry;
  RegisterBuiltinEnvs(registry);
  EXPECT_FALSE(registry.Register("calc", "", nullptr).ok());
  StatusOr<ConfigDocument> doc =
      ConfigDocument::ParseString("[env]\nname = \"calc\"\n[env.calc]\ndifficulty = 3\n", "t.toml");
  ASSERT_TRUE(doc.ok());
  ConfigTable root = doc->root();
  StatusOr<std::unique_ptr<Env>> env = CreateEnvFromConfig(root, registry);
  ASSERT_TRUE(env.ok());
  EXPECT_TRUE(doc->Finish().ok());
  EXPECT_EQ((*env)->Task(Split::kTrain, 0)->id.find("calc/train/d3/"), 0u);

  doc = ConfigDocument::ParseString("[env]\nname = \"calc\"\n[env.calc]\ndifficultty = 3\n",
                                    "t.toml");
  root = doc->root();
  ASSERT_TRUE(CreateEnvFromConfig(root, registry).ok());
  Status s = doc->Finish();
  EXPECT_NE(s.message().find("difficultty"), std::string::npos) << s.message();

  doc = ConfigDocument::ParseString("[env]\nname = \"nope\"\n", "t.toml");
  root = doc->root();
  StatusOr<std::unique_ptr<Env>> bad = CreateEnvFromConfig(root, registry);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown environment 'nope' (registered: calc"),
            std::string::npos);
}

// Sandbox pools follow the caller's demand: by default one sandbox per episode in flight, and a
// config asking for fewer is refused in one line (episodes beyond the pool would stall).
TEST(EnvRegistryTest, SandboxPoolsAreSizedFromTheEpisodesInFlight) {
  EnvRegistry registry;
  RegisterBuiltinEnvs(registry);
  const EnvDemand slots{32, "rl.rollout.slots"};
  const std::string mcp = "[[env.mcp]]\nname = \"fs\"\ncommand = [\"/bin/true\"]\n";
  StatusOr<ConfigDocument> doc =
      ConfigDocument::ParseString("[env]\nname = \"python\"\n" + mcp, "t.toml");
  ASSERT_TRUE(doc.ok());
  ConfigTable root = doc->root();
  ASSERT_TRUE(CreateEnvFromConfig(root, registry, slots).ok());
  ASSERT_TRUE(doc->Finish().ok()) << doc->Finish().ToString();
  EXPECT_NE(doc->ResolvedText().find("env.python.pool_size = 32  # default\n"), std::string::npos)
      << doc->ResolvedText();
  EXPECT_NE(doc->ResolvedText().find("env.mcp[0].pool_size = 32  # default\n"), std::string::npos)
      << doc->ResolvedText();

  doc = ConfigDocument::ParseString(
      "[env]\nname = \"external\"\n[env.external]\ncommand = [\"/bin/true\"]\npool_size = 16\n",
      "t.toml");
  root = doc->root();
  (void)CreateEnvFromConfig(root, registry, slots);
  EXPECT_EQ(doc->Finish().message(),
            "t.toml:5: env.external.pool_size: expected at least 32 (one sandbox per episode in "
            "flight: rl.rollout.slots), got 16");

  doc = ConfigDocument::ParseString("[env]\nname = \"calc\"\n" + mcp + "pool_size = 8\n", "t.toml");
  root = doc->root();
  ASSERT_TRUE(CreateEnvFromConfig(root, registry, slots).ok());
  EXPECT_EQ(doc->Finish().message(),
            "t.toml:6: env.mcp[0].pool_size: expected at least 32 (one sandbox per episode in "
            "flight: rl.rollout.slots), got 8");

  // Without a known demand (env try, env serve): 16 by default, any size accepted.
  doc = ConfigDocument::ParseString("[env]\nname = \"python\"\n[env.python]\npool_size = 2\n",
                                    "t.toml");
  root = doc->root();
  ASSERT_TRUE(CreateEnvFromConfig(root, registry).ok());
  EXPECT_TRUE(doc->Finish().ok()) << doc->Finish().ToString();
  doc = ConfigDocument::ParseString("[env]\nname = \"python\"\n", "t.toml");
  root = doc->root();
  ASSERT_TRUE(CreateEnvFromConfig(root, registry).ok());
  EXPECT_NE(doc->ResolvedText().find("env.python.pool_size = 16  # default\n"), std::string::npos)
      << doc->ResolvedText();
}

}  // namespace
}  // namespace orrery::env
