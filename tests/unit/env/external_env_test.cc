#include "env/external/external_env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

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

}  // namespace
}  // namespace orrery::env
