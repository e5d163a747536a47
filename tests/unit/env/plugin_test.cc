#include "env/plugin.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "env/registry.h"

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
