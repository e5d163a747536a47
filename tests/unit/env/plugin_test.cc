#include "env/plugin.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "env/registry.h"
#include "env/sandbox/isolated_grading.h"
#include "tests/unit/env/hidden_test_solutions.h"

namespace orrery::env {
namespace {

// The example plug-in is built into <build>/lib; this binary lives in <build>/tests.
std::string PluginPath() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path().string() +
         "/lib/liborrery_example_env_plugin.so";
}

TEST(EnvPluginTest, ExamplePluginRegistersAWorkingEnvironment) {
  StatusOr<ConfigDocument> doc =
      ConfigDocument::ParseString("[env]\nname = \"countdown\"\nplugins = [\"" + PluginPath() +
                                      "\"]\n[env.countdown]\nmax_target = 50\n",
                                  "plugin.toml");
  ASSERT_TRUE(doc.ok());
  EnvRegistry registry;
  RegisterBuiltinEnvs(registry);
  ConfigTable root = doc->root();
  StatusOr<std::unique_ptr<Env>> env = CreateEnvFromConfig(root, registry);
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  ASSERT_TRUE(doc->Finish().ok()) << doc->Finish().ToString();
  EXPECT_EQ((*env)->name(), "countdown");
  std::unique_ptr<Episode> e =
      std::move(*(*env)->Reset(*(*env)->Task(Split::kTrain, 1), DeadlineIn(5)));
  // Parse the target from the prompt and reach it: add 1 until the counter equals it.
  const std::string& prompt = e->initial_messages()[0].content;
  const int target = std::stoi(prompt.substr(prompt.find("exactly ") + 8));
  EXPECT_EQ(target % 2, 0);  // train targets are even
  StatusOr<ToolResult> r = ToolResult{};
  for (int i = 0; i < target; ++i) r = e->Step(ToolCall{"c", "add", "{\"n\": 1}"}, DeadlineIn(5));
  EXPECT_EQ(r->content, "counter = " + std::to_string(target));
  StatusOr<EpisodeScore> s = e->Score({}, DeadlineIn(5));
  EXPECT_EQ(s->components["reached"], 1.0);
  EXPECT_TRUE(e->Step(ToolCall{"c", "add", "{\"n\": 10}"}, DeadlineIn(5))->is_error);
}

// The hidden_tests example keeps its tests in a file on the host and grades through
// GradeIsolated: a solution that looks for them (at their host path, /env, /work) scores 0.
TEST(EnvPluginTest, HiddenTestsPluginGradesWhereTheSolutionCannotLook) {
  const char* source = std::getenv("ORRERY_SOURCE_DIR");
  ASSERT_NE(source, nullptr);
  const std::string tests_path = std::string(source) + "/env/examples/grade_env_tests.json";
  const std::string plugin = std::filesystem::path(PluginPath())
                                 .replace_filename("liborrery_example_hidden_tests_plugin.so");
  StatusOr<ConfigDocument> doc = ConfigDocument::ParseString(
      "[env]\nname = \"hidden_tests\"\nplugins = [\"" + plugin +
          "\"]\n[env.hidden_tests]\npool_size = 1\ntests_file = \"" + tests_path + "\"\n",
      "plugin.toml");
  ASSERT_TRUE(doc.ok());
  EnvRegistry registry;
  RegisterBuiltinEnvs(registry);
  ConfigTable root = doc->root();
  StatusOr<std::unique_ptr<Env>> env = CreateEnvFromConfig(root, registry);
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  ASSERT_TRUE(doc->Finish().ok()) << doc->Finish().ToString();
  std::unique_ptr<Episode> e =
      std::move(*(*env)->Reset(*(*env)->Task(Split::kTrain, 0), DeadlineIn(5)));
  EXPECT_NE(e->initial_messages()[0].content.find("how many"), std::string::npos);
  const auto score = [&](const std::string& final_message) {
    StatusOr<EpisodeScore> s = e->Score(
        {e->initial_messages()[0], ChatMessage{ChatRole::kAssistant, final_message, {}, "", ""}},
        DeadlineIn(60));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? s->reward : -1;
  };
  EXPECT_EQ(score(CountSolutionMessage()), 1.0);
  EXPECT_EQ(score(CheatingSolutionMessage(tests_path)), 0.0);
}

// GradeIsolated refuses a sandbox that could show the code under test anything but itself.
TEST(EnvPluginTest, IsolatedGradingRefusesASandboxWithBinds) {
  SandboxOptions o;
  o.ro_binds.emplace_back("/etc", "/data");
  StatusOr<std::unique_ptr<Sandbox>> s = Sandbox::Create(o, 9);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  StatusOr<Grade> g = GradeIsolated(**s, {{}, {"/bin/true"}, 1}, {{"", ""}}, DeadlineIn(10));
  EXPECT_EQ(g.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(g.status().message().find("1 extra bind(s)"), std::string::npos)
      << g.status().ToString();
  s = Sandbox::Create(IsolatedSandboxOptions(o), 9);
  ASSERT_TRUE(s.ok());
  g = GradeIsolated(**s, {{{"a.txt", "hi\n"}}, {"/usr/bin/cat", "a.txt"}, 5},
                    {{"", "hi"}, {"", "ho"}}, DeadlineIn(10));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->num_passed, 1);
  EXPECT_EQ(g->passed, (std::vector<bool>{true, false}));
  EXPECT_EQ(g->fraction(), 0.5);
}

TEST(EnvPluginTest, BadPluginsFailWithTheirPath) {
  EnvRegistry registry;
  Status s = LoadEnvPlugin("/nonexistent/libx.so", registry);
  EXPECT_NE(s.message().find("/nonexistent/libx.so: cannot load"), std::string::npos);
  s = LoadEnvPlugin("libc.so.6", registry);  // loads, but is no plug-in
  EXPECT_NE(s.message().find("missing orrery_env_plugin_abi_version"), std::string::npos);
  // Registering the same plug-in twice: the second registration of "countdown" fails.
  ASSERT_TRUE(LoadEnvPlugin(PluginPath(), registry).ok());
  EXPECT_FALSE(LoadEnvPlugin(PluginPath(), registry).ok());
}

}  // namespace
}  // namespace orrery::env
