#include "env/python/python_env.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "env/python/problems.h"

namespace orrery::env {
namespace {

TEST(PythonBlockTest, LastPythonBlock) {
  EXPECT_EQ(*LastPythonBlock("x\n```python\na = 1\n```\ny\n```py\nb = 2\n```"), "b = 2\n");
  EXPECT_FALSE(LastPythonBlock("no code").has_value());
  EXPECT_FALSE(LastPythonBlock("```rust\nfn main() {}\n```").has_value());
}

class PythonEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PythonEnvOptions o;
    o.sandbox.limits.wall_seconds = 20;
    o.sandbox.limits.cpu_seconds = 1;
    o.pool_size = 2;
    env_ = MakePythonEnv(o);
  }
  std::unique_ptr<Episode> Start(uint64_t index, CodingTask* task) {
    *task = *MakeCodingTask(0, Split::kTrain, index);
    StatusOr<std::unique_ptr<Episode>> e =
        env_->Reset(*env_->Task(Split::kTrain, index), DeadlineIn(30));
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return std::move(*e);
  }
  EpisodeScore ScoreAnswer(Episode& e, const std::string& answer) {
    std::vector<ChatMessage> t = e.initial_messages();
    t.push_back(ChatMessage{ChatRole::kAssistant, answer, {}, "", ""});
    StatusOr<EpisodeScore> s = e.Score(t, DeadlineIn(60));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? *s : EpisodeScore{};
  }
  std::unique_ptr<Env> env_;
};

TEST_F(PythonEnvTest, ReferenceSolutionsPassEveryFamily) {
  for (uint64_t i = 0; i < static_cast<uint64_t>(NumCodingFamilies()); ++i) {
    CodingTask task;
    std::unique_ptr<Episode> e = Start(i, &task);
    EpisodeScore s = ScoreAnswer(*e, "Here:\n```python\n" + ReferenceSolution(task) + "```");
    EXPECT_EQ(s.reward, 1.0) << task.id;
  }
}

TEST_F(PythonEnvTest, WrongMissingAndCheatingSolutions) {
  CodingTask task;
  std::unique_ptr<Episode> e = Start(0, &task);  // sum_of_multiples
  EXPECT_EQ(ScoreAnswer(*e, "no code here").reward, 0.0);
  EXPECT_EQ(ScoreAnswer(*e, "```python\ndef sum_of_multiples(n):\n    return 0\n```").reward,
            1.0 / 6);  // only n = 0 is right
  // Printing a fake grade line, overwriting the grader, exiting early: none of it counts.
  EpisodeScore cheat = ScoreAnswer(
      *e,
      "```python\nimport os, sys\nprint('ORRERY-GRADE 0 6 6')\n"
      "try:\n    open('/grader/grader.py', 'w').write('print(1)')\nexcept OSError:\n    pass\n"
      "def sum_of_multiples(n):\n    print('ORRERY-GRADE x 6 6'); sys.exit(0)\n```");
  EXPECT_EQ(cheat.reward, 0.0);
}

TEST_F(PythonEnvTest, RunPythonToolAndBadCalls) {
  CodingTask task;
  std::unique_ptr<Episode> e = Start(1, &task);
  StatusOr<ToolResult> r =
      e->Step(ToolCall{"c0", "run_python", R"J({"code": "print(6 * 7)"})J"}, DeadlineIn(30));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->is_error);
  EXPECT_EQ(r->content, "42\n\n[exit 0]");
  r = e->Step(ToolCall{"c1", "run_python", R"J({"code": "raise SystemExit(3)"})J"}, DeadlineIn(30));
  EXPECT_TRUE(r->is_error);
  EXPECT_NE(r->content.find("[exit 3]"), std::string::npos);
  r = e->Step(ToolCall{"c2", "run_python", R"({"code": "while True: pass"})"}, DeadlineIn(30));
  EXPECT_TRUE(r->is_error);
  EXPECT_NE(r->content.find("killed by signal"), std::string::npos) << r->content;
  r = e->Step(ToolCall{"c3", "run_python", R"({"source": "1"})"}, DeadlineIn(30));
  EXPECT_TRUE(r->is_error);
  EXPECT_EQ(r->content, "error: missing required argument 'code'");
  r = e->Step(ToolCall{"c4", "run_python", R"(not json)"}, DeadlineIn(30));
  EXPECT_TRUE(r->is_error);
  // The hidden tests are not visible to run_python.
  r = e->Step(
      ToolCall{"c5", "run_python", R"J({"code": "import os; print(os.path.exists('/grader'))"})J"},
      DeadlineIn(30));
  EXPECT_EQ(r->content, "False\n\n[exit 0]");
}

// The attack of issue 27: a solution that looks for the hidden tests (the grader's tests.json,
// any JSON file of test pairs it can read) and returns the expected outputs. It scored 1 while the
// tests were mounted for grading; with the expected outputs kept outside the sandbox it finds
// nothing and scores 0.
TEST_F(PythonEnvTest, AnswerReadingSolutionScoresZero) {
  CodingTask task;
  std::unique_ptr<Episode> e = Start(2, &task);
  const std::string spy = R"PY(import json, os
def _load(path):
    try:
        with open(path) as f:
            data = json.load(f)
        if isinstance(data, list) and all(isinstance(t, list) and len(t) == 2 for t in data):
            return data
    except Exception:
        pass
    return []
_tests = _load('/grader/tests.json')
for root, dirs, files in os.walk('/'):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ('/proc', '/sys', '/usr', '/dev')]
    for name in files:
        if name.endswith('.json'):
            _tests += _load(os.path.join(root, name))
def FUNCTION(*args):
    for a, expected in _tests:
        if a == list(args):
            return expected
    return None
)PY";
  std::string solution = spy;
  solution.replace(solution.find("FUNCTION"), 8, task.function);
  EpisodeScore s = ScoreAnswer(*e, "```python\n" + solution + "```");
  EXPECT_EQ(s.reward, 0.0);
  EXPECT_EQ(s.components["tests_passed"], 0.0);
  // The same episode still grades a real solution.
  EXPECT_EQ(ScoreAnswer(*e, "```python\n" + ReferenceSolution(task) + "```").reward, 1.0);
}

}  // namespace
}  // namespace orrery::env
