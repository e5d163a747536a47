// The MCP client against the real @modelcontextprotocol/server-filesystem (installed into
// .cache/npm by scripts/setup_npm_tools.sh), running inside the sandbox over its work dir, and
// against tests/fixtures/mcp_fake_server.py for what the real server cannot be made to do (a slow
// call, a tool that must be called as a task).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include "env/calc/calc_env.h"
#include "env/mcp/mcp_client.h"
#include "env/mcp/mcp_tools_env.h"
#include "env/tool_call.h"

namespace orrery::env {
namespace {

std::string NpmDir() {
  const char* s = std::getenv("ORRERY_SOURCE_DIR");
  return std::string(s ? s : ".") + "/.cache/npm";
}

const char* kServer = "/mcp/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js";

SandboxOptions ServerSandbox() {
  SandboxOptions o;
  o.ro_binds = {{NpmDir(), "/mcp"}};
  o.limits.address_space_bytes = 16ll << 30;  // V8 reserves large virtual ranges up front
  o.limits.wall_seconds = 120;
  o.limits.open_files = 1024;  // node opens every module file of its dependency tree at start-up
  return o;
}

class McpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(
        access((NpmDir() + "/node_modules/@modelcontextprotocol/server-filesystem").c_str(), F_OK),
        0)
        << "run scripts/setup_npm_tools.sh (part of scripts/setup.sh) to install the MCP server";
  }
};

TEST_F(McpTest, FilesystemServerInsideTheSandbox) {
  StatusOr<std::unique_ptr<Sandbox>> sandbox = Sandbox::Create(ServerSandbox(), 4200);
  ASSERT_TRUE(sandbox.ok()) << sandbox.status().ToString();
  ASSERT_TRUE((*sandbox)->WriteFile("notes/hello.txt", "hello from the host").ok());
  McpServerOptions o{"fs", {"/usr/bin/node", kServer, "/work"}, 60};
  StatusOr<std::unique_ptr<McpClient>> client = McpClient::Start(**sandbox, o, DeadlineIn(90));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_TRUE((*client)->HasTool("read_file") || (*client)->HasTool("read_text_file"));
  const std::string read = (*client)->HasTool("read_text_file") ? "read_text_file" : "read_file";
  EXPECT_TRUE((*client)->HasTool("write_file"));
  EXPECT_TRUE((*client)->HasTool("list_directory"));

  StatusOr<ToolResult> r = (*client)->CallTool(
      ToolCall{"c0", read, R"({"path": "/work/notes/hello.txt"})"}, DeadlineIn(30));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->is_error) << r->content;
  EXPECT_EQ(r->content, "hello from the host");

  r = (*client)->CallTool(
      ToolCall{"c1", "write_file", R"({"path": "/work/out.txt", "content": "written by MCP"})"},
      DeadlineIn(30));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->is_error) << r->content;
  std::ifstream f((*sandbox)->work_dir() + "/out.txt");
  std::string content((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(content, "written by MCP");

  // Outside the served directory: the server refuses, and the model sees an error result.
  r = (*client)->CallTool(ToolCall{"c2", read, R"({"path": "/usr/lib/os-release"})"},
                          DeadlineIn(30));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->is_error) << r->content;
  // Schema violations never reach the server.
  r = (*client)->CallTool(ToolCall{"c3", read, R"({"path": 7})"}, DeadlineIn(30));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->is_error);
  EXPECT_EQ(r->content, "error: argument 'path': expected a string, got integer");
}

TEST_F(McpTest, AttachedToTheCalcEnvironmentByConfig) {
  StatusOr<ConfigDocument> doc = ConfigDocument::ParseString(
      "[env]\nname = \"calc\"\n[[env.mcp]]\nname = \"fs\"\ndir = \"" + NpmDir() +
          "\"\ncommand = [\"/usr/bin/node\", \"" + kServer + "\", \"/work\"]\n",
      "mcp.toml");
  ASSERT_TRUE(doc.ok());
  std::vector<McpAttachment> servers;
  {
    ConfigTable root = doc->root();
    ConfigTable env = root.Table("env");
    (void)env.String("name", "");
    servers = ReadMcpAttachments(env, EnvDemand{});
    ASSERT_TRUE(doc->Finish().ok()) << doc->Finish().ToString();
  }
  ASSERT_EQ(servers.size(), 1u);
  std::unique_ptr<Env> env = WithMcpTools(calc::MakeCalcEnv({}), servers);
  StatusOr<std::unique_ptr<Episode>> ep = env->Reset(*env->Task(Split::kTrain, 0), DeadlineIn(90));
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  bool has_calc = false, has_fs = false;
  for (const ToolSpec& t : (*ep)->tools()) {
    has_calc |= t.name == "calculate";
    has_fs |= t.name == "list_directory";
  }
  EXPECT_TRUE(has_calc && has_fs);
  StatusOr<ToolResult> r =
      (*ep)->Step(ToolCall{"c0", "calculate", R"({"expression": "2 * 21"})"}, DeadlineIn(30));
  EXPECT_EQ(r->content, "42");
  r = (*ep)->Step(ToolCall{"c1", "list_directory", R"({"path": "/work"})"}, DeadlineIn(30));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->is_error) << r->content;
}

// Node's "Cannot find module" comes first, then a long stack: the quote keeps that line.
TEST_F(McpTest, AServerThatCannotStartIsQuotedByItsErrorLine) {
  StatusOr<std::unique_ptr<Sandbox>> sandbox = Sandbox::Create(ServerSandbox(), 4201);
  ASSERT_TRUE(sandbox.ok()) << sandbox.status().ToString();
  McpServerOptions o{"fs", {"/usr/bin/node", "/mcp/node_modules/no-such-server/index.js"}, 60};
  StatusOr<std::unique_ptr<McpClient>> client = McpClient::Start(**sandbox, o, DeadlineIn(90));
  ASSERT_FALSE(client.ok());
  const std::string message = client.status().message();
  EXPECT_NE(message.find("Cannot find module '/mcp/node_modules/no-such-server/index.js'"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

std::string FixturesDir() {
  const char* s = std::getenv("ORRERY_SOURCE_DIR");
  return std::string(s ? s : ".") + "/tests/fixtures";
}

McpAttachment FakeServer(double call_seconds) {
  McpAttachment a;
  a.server =
      McpServerOptions{"fake", {"/usr/bin/python3", "-u", "/mcp/mcp_fake_server.py"}, call_seconds};
  a.dir = FixturesDir();
  a.sandbox.limits.wall_seconds = 120;
  a.pool_size = 2;
  return a;
}

TEST(McpFakeServerTest, ToolsThatMustBeCalledAsTasksAreNotOffered) {
  StatusOr<McpToolsPage> page = ReadMcpToolsList(
      R"({"tools": [{"name": "a"}, {"name": "b", "execution": {"taskSupport": "required"}},
                    {"name": "c", "execution": {"taskSupport": "optional"}}]})",
      "fake");
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->tools.size(), 2u);
  EXPECT_EQ(page->tools[0].name, "a");
  EXPECT_EQ(page->tools[1].name, "c");
  EXPECT_EQ(page->task_only, std::vector<std::string>{"b"});
}

// Through the episode: the unknown tool's message lists the server's tools beside the
// environment's; a call past its deadline is a tool error, the server is told to cancel it and
// the episode goes on (the late reply is skipped).
TEST(McpFakeServerTest, SlowCallsAndUnknownToolsAreToolErrorsTheModelReads) {
  std::vector<McpAttachment> servers = {FakeServer(0.5)};
  std::unique_ptr<Env> env = WithMcpTools(calc::MakeCalcEnv({}), servers);
  StatusOr<std::unique_ptr<Episode>> ep = env->Reset(*env->Task(Split::kTrain, 0), DeadlineIn(30));
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  std::vector<std::string> names;
  for (const ToolSpec& t : (*ep)->tools()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"calculate", "echo", "slow"}));

  StatusOr<ToolResult> r = (*ep)->Step(ToolCall{"c0", "nope", "{}"}, DeadlineIn(10));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->is_error);
  EXPECT_EQ(r->content, "error: unknown tool 'nope' (available: calculate, echo, slow)");

  const auto start = Clock::now();
  r = (*ep)->Step(ToolCall{"c1", "slow", R"({"seconds": 1})"}, DeadlineIn(10));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 1.5);
  EXPECT_TRUE(r->is_error);
  EXPECT_NE(r->content.find("MCP server 'fake': tool 'slow' did not answer within"),
            std::string::npos)
      << r->content;
  // The server answers one call at a time: once it is done with the slow one, whose late reply
  // comes first, the next call gets its own answer.
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  r = (*ep)->Step(ToolCall{"c2", "echo", R"({"text": "still here"})"}, DeadlineIn(10));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->is_error) << r->content;
  EXPECT_EQ(r->content, "still here");
  r = (*ep)->Step(ToolCall{"c3", "calculate", R"({"expression": "2 * 21"})"}, DeadlineIn(10));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->content, "42");
}

}  // namespace
}  // namespace orrery::env
