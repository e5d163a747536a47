#include "env/external/external_env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/config.h"
#include "env/external/json_rpc_channel.h"
#include "env/external/run_isolated.h"
#include "env/registry.h"
#include "tests/unit/env/hidden_test_solutions.h"

namespace orrery::env {
namespace {

std::string SourceDir() {
  const char* s = std::getenv("ORRERY_SOURCE_DIR");
  return s ? s : ".";
}

ExternalEnvOptions GuessOptions() {
  ExternalEnvOptions o;
  o.dir = SourceDir() + "/env/examples";
  o.command = {"/usr/bin/python3", "-u", "/env/guess_env.py"};
  o.pool_size = 2;
  return o;
}

TEST(ExternalEnvTest, PythonExampleEpisodeBinarySearch) {
  StatusOr<std::unique_ptr<Env>> env = MakeExternalEnv(GuessOptions());
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  EXPECT_EQ((*env)->name(), "guess");
  StatusOr<std::unique_ptr<Episode>> ep =
      (*env)->Reset(*(*env)->Task(Split::kTrain, 3), DeadlineIn(30));
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  Episode& e = **ep;
  ASSERT_EQ(e.tools().size(), 1u);
  EXPECT_EQ(e.tools()[0].name, "guess");
  EXPECT_EQ(e.initial_messages().size(), 2u);
  int lo = 1, hi = 100, found = -1, calls = 0;
  while (lo <= hi && found < 0) {
    const int mid = (lo + hi) / 2;
    StatusOr<ToolResult> r = e.Step(
        ToolCall{"c" + std::to_string(calls++), "guess", "{\"n\": " + std::to_string(mid) + "}"},
        DeadlineIn(30));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (r->content == "correct")
      found = mid;
    else if (r->content == "higher")
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  ASSERT_GT(found, 0);
  EXPECT_EQ(found % 2, 1);  // train secrets are odd
  std::vector<ChatMessage> t = e.initial_messages();
  t.push_back(ChatMessage{ChatRole::kAssistant, "Answer: " + std::to_string(found), {}, "", ""});
  StatusOr<EpisodeScore> s = e.Score(t, DeadlineIn(30));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->reward, 1.0);
  EXPECT_EQ(s->components["guesses"], calls);
  // Bad calls never reach the program: the schema check answers them.
  EXPECT_EQ(e.Step(ToolCall{"x", "guess", "{\"n\": 500}"}, DeadlineIn(5))->content,
            "error: argument 'n': above the maximum 100");
  EXPECT_EQ(e.Step(ToolCall{"x", "guess", "{\"n\": \"five\"}"}, DeadlineIn(5))->content,
            "error: argument 'n': expected an integer, got string");
  EXPECT_TRUE(e.Step(ToolCall{"x", "shell", "{}"}, DeadlineIn(5))->is_error);
}

// A rollout with more slots than the old fixed pool of 16 holds all its episodes open at once:
// the pool is sized from the demand, so no Reset waits for a sandbox.
TEST(ExternalEnvTest, PoolServesEveryEpisodeInFlight) {
  const std::string text = "[env]\nname = \"external\"\n[env.external]\ndir = \"" + SourceDir() +
                           "/env/examples\"\ncommand = [\"/usr/bin/python3\", \"-u\", " +
                           "\"/env/guess_env.py\"]\n";
  StatusOr<ConfigDocument> doc = ConfigDocument::ParseString(text, "t.toml");
  ASSERT_TRUE(doc.ok());
  ConfigTable root = doc->root();
  EnvRegistry registry;
  RegisterBuiltinEnvs(registry);
  StatusOr<std::unique_ptr<Env>> env =
      CreateEnvFromConfig(root, registry, EnvDemand{20, "rl.rollout.slots"});
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  ASSERT_TRUE(doc->Finish().ok()) << doc->Finish().ToString();
  std::vector<std::unique_ptr<Episode>> open;
  for (uint64_t i = 0; i < 20; ++i) {
    StatusOr<std::unique_ptr<Episode>> ep =
        (*env)->Reset(*(*env)->Task(Split::kTrain, i), DeadlineIn(5));
    ASSERT_TRUE(ep.ok()) << "episode " << i << ": " << ep.status().ToString();
    open.push_back(std::move(ep).value());
  }
}

TEST(ExternalEnvTest, BadProgramsFailWithOneClearLine) {
  ExternalEnvOptions o = GuessOptions();
  o.command = {"/usr/bin/python3", "-c", "import sys; sys.exit(3)"};
  StatusOr<std::unique_ptr<Env>> env = MakeExternalEnv(o);
  ASSERT_FALSE(env.ok());
  EXPECT_NE(env.status().message().find("describe"), std::string::npos) << env.status().message();

  o.command = {"/usr/bin/python3", "-c",
               "import sys, json\nfor l in sys.stdin:\n    r = json.loads(l)\n"
               "    print(json.dumps({'jsonrpc': '2.0', 'id': r['id'], 'result': {'protocol': "
               "'v0'}}), flush=True)"};
  env = MakeExternalEnv(o);
  ASSERT_FALSE(env.ok());
  EXPECT_NE(env.status().message().find("speaks protocol 'v0', expected 'orrery-env/1'"),
            std::string::npos)
      << env.status().message();

  // A program that never answers: the deadline holds.
  o.command = {"/usr/bin/python3", "-c", "import time; time.sleep(60)"};
  o.call_seconds = 1;
  const auto start = Clock::now();
  env = MakeExternalEnv(o);
  EXPECT_EQ(env.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5.0);
}

// A program whose replies have the wrong JSON types: each is an error (a tool error the model
// reads, or an error Status), never an exception that aborts the process.
constexpr const char* kMalformedEnv = R"PY(import json, sys
for line in sys.stdin:
    r = json.loads(line)
    m, p = r['method'], r.get('params', {})
    res = {}
    if m == 'describe':
        res = {'protocol': 'orrery-env/1', 'name': 'malformed'}
    elif m == 'reset':
        desc = 5 if p['task']['index'] == 0 else 'a tool'
        schema = {'type': 'object', 'properties': {'mode': {'type': 'string'},
                  's': {'type': 'string', 'maxLength': '10'}}}
        res = {'messages': [{'role': 'user', 'content': 'hi'}],
               'tools': [{'type': 'function', 'function': {'name': 't', 'description': desc,
                                                           'parameters': schema}}]}
    elif m == 'step':
        mode = p['tool_call']['arguments'].get('mode')
        if mode == 'bool':
            res = {'content': 'x', 'is_error': 'yes'}
        elif mode == 'array':
            res = [1, 2]
        elif mode == 'trunc':
            sys.stdout.write('{"jsonrpc": "2.0", "id": %d, "result": {"cont\n' % r['id'])
            sys.stdout.flush()
            continue
    elif m == 'score':
        res = {'reward': 1, 'components': {'n': len(p['messages'])}}
    print(json.dumps({'jsonrpc': '2.0', 'id': r['id'], 'result': res}), flush=True)
)PY";

TEST(ExternalEnvTest, MalformedRepliesAndInvalidUtf8AreErrorsNotAborts) {
  const std::string dir = testing::TempDir() + "/malformed_env";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/env.py") << kMalformedEnv;
  ExternalEnvOptions o = GuessOptions();
  o.dir = dir;
  o.command = {"/usr/bin/python3", "-u", "/env/env.py"};
  StatusOr<std::unique_ptr<Env>> env = MakeExternalEnv(o);
  ASSERT_TRUE(env.ok()) << env.status().ToString();

  // A non-string tool description fails the reset with the field named.
  StatusOr<std::unique_ptr<Episode>> ep =
      (*env)->Reset(*(*env)->Task(Split::kTrain, 0), DeadlineIn(30));
  ASSERT_FALSE(ep.ok());
  EXPECT_NE(ep.status().message().find("'description' must be a string"), std::string::npos)
      << ep.status().message();

  ep = (*env)->Reset(*(*env)->Task(Split::kTrain, 1), DeadlineIn(30));
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  Episode& e = **ep;
  // "maxLength": "10" in the tool's schema: a tool error the model reads.
  StatusOr<ToolResult> r = e.Step(ToolCall{"c0", "t", R"({"s": "abc"})"}, DeadlineIn(10));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->is_error);
  EXPECT_NE(r->content.find("'maxLength' must be a non-negative integer, got string"),
            std::string::npos)
      << r->content;
  // "is_error": "yes" and a result that is not an object: tool errors the model reads.
  r = e.Step(ToolCall{"c1", "t", R"({"mode": "bool"})"}, DeadlineIn(10));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->is_error);
  EXPECT_NE(r->content.find("'is_error' must be a boolean"), std::string::npos) << r->content;
  r = e.Step(ToolCall{"c2", "t", R"({"mode": "array"})"}, DeadlineIn(10));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->is_error);
  EXPECT_NE(r->content.find("'content'"), std::string::npos) << r->content;
  // The model's final answer holds an invalid UTF-8 byte: scored, no abort.
  std::vector<ChatMessage> t = e.initial_messages();
  t.push_back(ChatMessage{ChatRole::kAssistant, "Answer: \xff", {}, "", ""});
  StatusOr<EpisodeScore> s = e.Score(t, DeadlineIn(10));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->reward, 1.0);
  // Truncated JSON is stray output: the call fails at its deadline.
  r = e.Step(ToolCall{"c3", "t", R"({"mode": "trunc"})"}, DeadlineIn(2));
  EXPECT_FALSE(r.ok());
}

// A server's stderr in an error message: one line, the first error line kept even when the tail
// is long (node's "Cannot find module" comes before its stack).
TEST(StderrExcerptTest, KeepsTheFirstErrorLineAndTheEnd) {
  EXPECT_EQ(StderrExcerpt("short\nand sweet\n"), "short | and sweet");
  std::string node =
      "node:internal/modules/cjs/loader:1228\n  throw err;\n  ^\n\n"
      "Error: Cannot find module '/mcp/x.js'\n";
  for (int i = 0; i < 40; ++i) node += "    at Module._load (node:internal/modules/cjs/loader)\n";
  node += "Node.js v20.19.2\n";
  const std::string quoted = StderrExcerpt(node, 400);
  EXPECT_LE(quoted.size(), 400u);
  EXPECT_EQ(quoted.rfind("Error: Cannot find module '/mcp/x.js' ... ", 0), 0u) << quoted;
  EXPECT_NE(quoted.find("Node.js v20.19.2"), std::string::npos) << quoted;
  EXPECT_EQ(quoted.find('\n'), std::string::npos);
  std::string python = "Traceback (most recent call last):\n";
  for (int i = 0; i < 40; ++i) python += "  File \"/env/x.py\", line 1, in <module>\n";
  python += "ModuleNotFoundError: No module named 'numpy'\n";
  EXPECT_NE(StderrExcerpt(python, 400).find("ModuleNotFoundError: No module named 'numpy'"),
            std::string::npos);
}

}  // namespace
}  // namespace orrery::env

namespace orrery::env {
namespace {

ExternalEnvOptions GradeOptions() {
  ExternalEnvOptions o;
  o.dir = SourceDir() + "/env/examples";
  o.command = {"/usr/bin/python3", "-u", "/env/grade_env.py"};
  o.pool_size = 2;
  return o;
}

double ScoreFinal(Episode& e, const std::string& final_message) {
  std::vector<ChatMessage> t = e.initial_messages();
  t.push_back(ChatMessage{ChatRole::kAssistant, final_message, {}, "", ""});
  StatusOr<EpisodeScore> s = e.Score(t, DeadlineIn(60));
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? s->reward : -1;
}

// The example keeps its hidden tests in /env/grade_env_tests.json. Graded through run_isolated,
// a solution that looks for them finds nothing; the same solution where /env is visible (as it
// would be had the program run it itself) reads them and prints the expected outputs.
TEST(ExternalEnvTest, RunIsolatedGradesWhereTheSolutionCannotReadTheTests) {
  StatusOr<std::unique_ptr<Env>> env = MakeExternalEnv(GradeOptions());
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  EXPECT_EQ((*env)->name(), "grade");
  const std::string tests_path = SourceDir() + "/env/examples/grade_env_tests.json";
  StatusOr<std::unique_ptr<Episode>> ep =
      (*env)->Reset(*(*env)->Task(Split::kTrain, 0), DeadlineIn(30));
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  EXPECT_NE((*ep)->initial_messages()[1].content.find("how many"), std::string::npos);
  EXPECT_EQ(ScoreFinal(**ep, CountSolutionMessage()), 1.0);
  EXPECT_EQ(ScoreFinal(**ep, CheatingSolutionMessage(tests_path)), 0.0);
  EXPECT_EQ(ScoreFinal(**ep, "no code"), 0.0);

  // The run_python tool goes through run_isolated too: /env is not there.
  StatusOr<ToolResult> r = (*ep)->Step(
      ToolCall{
          "c0", "run_python",
          R"J({"code": "import os, sys\nprint(sum(map(int, sys.stdin.read().split())), os.path.exists('/env'))", "stdin": "20 22"})J"},
      DeadlineIn(30));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->content, "42 False\n\n[exit 0]");

  // The control: the cheat works wherever the tests are visible.
  SandboxOptions visible;
  visible.ro_binds.emplace_back(SourceDir() + "/env/examples", "/env");
  StatusOr<std::unique_ptr<Sandbox>> s = Sandbox::Create(visible, 7);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const std::string cheat = CheatingSolutionMessage(tests_path);
  const size_t begin = cheat.find('\n') + 1;
  ASSERT_TRUE((*s)->WriteFile("solution.py", cheat.substr(begin, cheat.rfind("```") - begin)).ok());
  StatusOr<RunResult> run =
      (*s)->Run({"/usr/bin/python3", "-I", "solution.py"}, "-4 5 6 -7 8\n", DeadlineIn(30));
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(run->stdout_text, "5\n");
}

TEST(ExternalEnvTest, RunIsolatedParamsAreCheckedAndBounded) {
  StatusOr<RunIsolatedRequest> r = ReadRunIsolatedParams(
      R"({"files": {"a.py": "x"}, "argv": ["/usr/bin/python3", "a.py"], "inputs": ["1", "2"],
          "seconds_each": 100})",
      30);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->program.files.size(), 1u);
  EXPECT_EQ(r->program.argv.size(), 2u);
  EXPECT_EQ(r->inputs.size(), 2u);
  EXPECT_EQ(r->program.seconds_each, 30);  // cut to the call's wall_seconds
  r = ReadRunIsolatedParams(R"({"argv": ["/bin/true"]})", 3);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->inputs, std::vector<std::string>{""});
  EXPECT_EQ(r->program.seconds_each, 3);
  const std::pair<std::string, std::string> bad[] = {
      {"[1]", "params must be a JSON object"},
      {R"({"argv": []})", "'argv' must be a non-empty array"},
      {R"({"argv": ["a", 1]})", "'argv' must hold strings only"},
      {R"({"argv": ["a"], "files": []})", "'files' must be an object"},
      {R"({"argv": ["a"], "files": {"x": 1}})", "files['x'] must be a string"},
      {R"({"argv": ["a"], "inputs": "x"})", "'inputs' must be an array"},
      {R"({"argv": ["a"], "inputs": [1]})", "'inputs' must hold strings only"},
      {R"({"argv": ["a"], "seconds_each": -1})", "'seconds_each' must be a positive number"},
      {"{\"argv\": [\"a\"], \"x\": " + std::string(1000, '[') + "}", "must be a JSON object"},
  };
  for (const auto& [params, message] : bad) {
    r = ReadRunIsolatedParams(params, 30);
    ASSERT_FALSE(r.ok()) << params;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(message), std::string::npos) << r.status().message();
  }
  std::string many = R"({"argv": ["a"], "inputs": [)";
  for (int i = 0; i <= static_cast<int>(kRunIsolatedMaxInputs); ++i) many += i ? ",\"\"" : "\"\"";
  EXPECT_NE(ReadRunIsolatedParams(many + "]}", 30).status().message().find("at most 256 inputs"),
            std::string::npos);
  RunResult run;
  run.exit_code = 0;
  run.stdout_text = "ok\xff\n";
  EXPECT_EQ(RunIsolatedResultJson({run}),
            "{\"runs\":[{\"exit_code\":0,\"limit_exceeded\":\"\",\"output_truncated\":false,"
            "\"signal\":0,\"status\":\"exit 0\",\"stderr\":\"\",\"stdout\":\"ok\xef\xbf\xbd\\n\","
            "\"timed_out\":false,\"wall_seconds\":0.0}]}");
}

}  // namespace
}  // namespace orrery::env
