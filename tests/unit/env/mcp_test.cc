// The MCP client against the real @modelcontextprotocol/server-filesystem and
// server-everything (installed into .cache/npm by scripts/setup_npm_tools.sh), running inside the
// sandbox over its work dir, and against tests/fixtures/mcp_fake_server.py for what the real
// servers cannot be made to do deterministically (a slow call, a tool that must be called as a
// task, requests to the client at chosen moments, a protocol version the client does not speak).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "core/logging.h"
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
const char* kEverything = "/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js";

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
    for (const char* server : {"server-filesystem", "server-everything"}) {
      ASSERT_EQ(access((NpmDir() + "/node_modules/@modelcontextprotocol/" + server).c_str(), F_OK),
                0)
          << "run scripts/setup_npm_tools.sh (part of scripts/setup.sh) to install the MCP servers";
    }
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

// Episodes of an environment configured by `toml` (an [env] table), for the tests below.
std::unique_ptr<Env> McpEnvFromConfig(const std::string& toml) {
  StatusOr<ConfigDocument> doc = ConfigDocument::ParseString(toml, "mcp.toml");
  EXPECT_TRUE(doc.ok()) << doc.status().ToString();
  if (!doc.ok()) return nullptr;
  std::vector<McpAttachment> servers;
  {
    ConfigTable root = doc->root();
    ConfigTable env = root.Table("env");
    (void)env.String("name", "");
    servers = ReadMcpAttachments(env, EnvDemand{});
  }
  Status finished = doc->Finish();
  EXPECT_TRUE(finished.ok()) << finished.ToString();
  if (!finished.ok()) return nullptr;
  return WithMcpTools(calc::MakeCalcEnv({}), servers);
}

// roots = ["/work", "/tmp"]: the filesystem server replaces the directories of its command line
// with the client's roots, so /tmp (private to the server's process) becomes writable. A marker
// written there in one episode is still there in the next one when the server is kept
// (reuse_server), and gone when each episode starts its own; /work is emptied either way.
TEST_F(McpTest, AStatelessServerIsKeptAcrossEpisodesWhenConfigured) {
  for (const bool reuse : {true, false}) {
    SCOPED_TRACE(reuse ? "reuse_server = true" : "reuse_server = false");
    std::unique_ptr<Env> env = McpEnvFromConfig(
        "[env]\nname = \"calc\"\n[[env.mcp]]\nname = \"fs\"\ndir = \"" + NpmDir() +
        "\"\ncommand = [\"/usr/bin/node\", \"" + kServer + "\", \"/work\"]\nroots = [\"/work\", " +
        "\"/tmp\"]\npool_size = 1\nreuse_server = " + (reuse ? "true" : "false") + "\n");
    ASSERT_NE(env, nullptr);
    const TaskRef task = *env->Task(Split::kTrain, 0);
    for (int episode = 0; episode < 2; ++episode) {
      StatusOr<std::unique_ptr<Episode>> ep = env->Reset(task, DeadlineIn(90));
      ASSERT_TRUE(ep.ok()) << ep.status().ToString();
      // The server takes the roots in the background after `initialized`: wait until it has.
      StatusOr<ToolResult> r = InternalError("not called");
      for (int i = 0; i < 100; ++i) {
        r = (*ep)->Step(ToolCall{"c0", "list_allowed_directories", "{}"}, DeadlineIn(30));
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        if (r->content.find("/tmp") != std::string::npos) break;
      }
      ASSERT_NE(r->content.find("/tmp"), std::string::npos) << r->content;
      r = (*ep)->Step(ToolCall{"c1", "list_directory", R"({"path": "/work"})"}, DeadlineIn(30));
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->content.find("episode.txt"), std::string::npos) << r->content;
      r = (*ep)->Step(ToolCall{"c2", "list_directory", R"({"path": "/tmp"})"}, DeadlineIn(30));
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      const bool marker = r->content.find("marker.txt") != std::string::npos;
      EXPECT_EQ(marker, reuse && episode == 1) << r->content;
      for (const char* path : {"/work/episode.txt", "/tmp/marker.txt"}) {
        r = (*ep)->Step(ToolCall{"c3", "write_file",
                                 std::string(R"({"path": ")") + path + R"(", "content": "x"})"},
                        DeadlineIn(30));
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        EXPECT_FALSE(r->is_error) << r->content;
      }
    }
  }
}

// server-everything registers its tools from the client's capabilities: get-roots-list only for
// a client with roots, the sampling and elicitation tools only for one that declares those (this
// one does not), simulate-research-query only as a task (left out). Its image, embedded resource
// and resource link results reach the model as text descriptions.
TEST_F(McpTest, EverythingServerNegotiatesAndDescribesItsContent) {
  StatusOr<std::unique_ptr<Sandbox>> sandbox = Sandbox::Create(ServerSandbox(), 4202);
  ASSERT_TRUE(sandbox.ok()) << sandbox.status().ToString();
  McpServerOptions o{"everything", {"/usr/bin/node", kEverything, "stdio"}, 60};
  StatusOr<std::unique_ptr<McpClient>> client = McpClient::Start(**sandbox, o, DeadlineIn(90));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  McpClient& c = **client;
  EXPECT_EQ(c.session().protocol_version, "2025-06-18");
  EXPECT_EQ(c.session().server_name, "mcp-servers/everything");
  EXPECT_TRUE(c.HasTool("get-tiny-image"));
  EXPECT_TRUE(c.HasTool("get-roots-list"));
  EXPECT_FALSE(c.HasTool("trigger-sampling-request"));
  EXPECT_FALSE(c.HasTool("trigger-elicitation-request"));
  EXPECT_FALSE(c.HasTool("simulate-research-query"));
  EXPECT_EQ(c.skipped_tools(), std::vector<std::string>{"simulate-research-query"});

  // The server asks for the roots (roots/list) while the call waits.
  StatusOr<ToolResult> r = c.CallTool(ToolCall{"c0", "get-roots-list", "{}"}, DeadlineIn(30));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->is_error) << r->content;
  EXPECT_NE(r->content.find("URI: file:///work"), std::string::npos) << r->content;

  r = c.CallTool(ToolCall{"c1", "get-tiny-image", "{}"}, DeadlineIn(30));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(std::regex_search(
      r->content, std::regex("Here's the image you requested:\n\\[image: image/png, [1-9][0-9]* "
                             "bytes\\]\nThe image above is the MCP logo.")))
      << r->content;

  r = c.CallTool(
      ToolCall{"c2", "get-resource-reference", R"({"resourceType": "Text", "resourceId": 2})"},
      DeadlineIn(30));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->is_error) << r->content;
  EXPECT_TRUE(
      std::regex_search(r->content, std::regex("\n\\[resource: demo://resource/dynamic/text/2, "
                                               "text/plain\\]\nResource 2: This is a plaintext")))
      << r->content;

  r = c.CallTool(ToolCall{"c3", "get-resource-links", R"({"count": 2})"}, DeadlineIn(30));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(std::regex_search(
      r->content,
      std::regex("\n\\[resource link: Blob Resource 1, demo://resource/dynamic/blob/1, "
                 "text/plain: Resource 1: [a-z ]+\\]\n\\[resource link: Text Resource 2, "
                 "demo://resource/dynamic/text/2, text/plain: Resource 2: [a-z ]+\\]")))
      << r->content;
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

McpAttachment FakeServer(double call_seconds, std::vector<std::string> flags = {}) {
  McpAttachment a;
  a.server =
      McpServerOptions{"fake", {"/usr/bin/python3", "-u", "/mcp/mcp_fake_server.py"}, call_seconds};
  a.server.command.insert(a.server.command.end(), flags.begin(), flags.end());
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
  EXPECT_EQ(names,
            (std::vector<std::string>{"calculate", "echo", "slow", "client_info", "ask_client"}));

  StatusOr<ToolResult> r = (*ep)->Step(ToolCall{"c0", "nope", "{}"}, DeadlineIn(10));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->is_error);
  EXPECT_EQ(r->content,
            "error: unknown tool 'nope' (available: calculate, echo, slow, client_info, "
            "ask_client)");

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

// A fake server's client in a sandbox of its own; the sandbox lives as long as the test.
struct FakeClient {
  std::unique_ptr<Sandbox> sandbox;
  StatusOr<std::unique_ptr<McpClient>> client = InternalError("not started");
};
FakeClient StartFake(uint32_t slot, std::vector<std::string> flags,
                     std::vector<std::string> roots = {"/work"}) {
  McpAttachment a = FakeServer(10, std::move(flags));
  a.server.roots = std::move(roots);
  a.sandbox.ro_binds.emplace_back(a.dir, "/mcp");
  FakeClient f;
  StatusOr<std::unique_ptr<Sandbox>> sandbox = Sandbox::Create(a.sandbox, slot);
  if (!sandbox.ok()) {
    f.client = sandbox.status();
    return f;
  }
  f.sandbox = *std::move(sandbox);
  f.client = McpClient::Start(*f.sandbox, a.server, DeadlineIn(30));
  return f;
}

nlohmann::json CallForJson(McpClient& client, const std::string& tool) {
  StatusOr<ToolResult> r = client.CallTool(ToolCall{"c0", tool, "{}"}, DeadlineIn(30));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return nullptr;
  EXPECT_FALSE(r->is_error) << r->content;
  return nlohmann::json::parse(r->content, nullptr, false);
}

TEST(McpFakeServerTest, AVersionTheClientDoesNotSpeakIsOneLineNamingBoth) {
  FakeClient f = StartFake(4210, {"--protocol-version", "1999-01-01"});
  ASSERT_FALSE(f.client.ok());
  EXPECT_EQ(f.client.status().message(),
            "MCP server 'fake' (fake-server) answered protocol version '1999-01-01', which this "
            "client does not speak (it offered 2025-06-18; it speaks 2025-06-18, 2025-03-26, "
            "2024-11-05)");
  // An older version the client speaks is accepted.
  f = StartFake(4210, {"--protocol-version", "2024-11-05"});
  ASSERT_TRUE(f.client.ok()) << f.client.status().ToString();
  EXPECT_EQ((*f.client)->session().protocol_version, "2024-11-05");
  EXPECT_EQ((*f.client)->session().server_name, "fake-server");
}

// The server pings before it answers initialize; the client answers, and declares roots only.
TEST(McpFakeServerTest, DeclaresRootsOnlyAndAnswersAPingBeforeInitialize) {
  FakeClient f = StartFake(4211, {"--ping-before-initialize"});
  ASSERT_TRUE(f.client.ok()) << f.client.status().ToString();
  nlohmann::json info = CallForJson(**f.client, "client_info");
  EXPECT_EQ(info["ping"], nlohmann::json::parse(R"({"result": {}})")) << info;
  EXPECT_EQ(info["params"]["protocolVersion"], "2025-06-18") << info;
  EXPECT_EQ(info["params"]["capabilities"],
            nlohmann::json::parse(R"({"roots": {"listChanged": false}})"))
      << info;
  // Without roots, no capability at all.
  f = StartFake(4211, {}, {});
  ASSERT_TRUE(f.client.ok()) << f.client.status().ToString();
  info = CallForJson(**f.client, "client_info");
  EXPECT_EQ(info["params"]["capabilities"], nlohmann::json::object()) << info;
}

// Requests the server sends while a tools/call waits are answered, so the call gets its reply:
// ping, roots/list with the roots as file:// URIs, sampling and elicitation refused (-32601).
// The server's notification before them is logged at debug level and otherwise ignored.
TEST(McpFakeServerTest, AnswersTheServersRequestsWhileACallWaits) {
  FakeClient f = StartFake(4212, {}, {"/work", "/work/a dir"});
  ASSERT_TRUE(f.client.ok()) << f.client.status().ToString();
  const LogLevel level = MinLogLevel();
  SetMinLogLevel(LogLevel::kDebug);
  testing::internal::CaptureStderr();
  nlohmann::json answers = CallForJson(**f.client, "ask_client");
  const std::string log = testing::internal::GetCapturedStderr();
  SetMinLogLevel(level);
  EXPECT_NE(log.find("MCP server 'fake': notifications/message {"), std::string::npos) << log;
  EXPECT_EQ(answers["ping"], nlohmann::json::parse(R"({"result": {}})")) << answers;
  EXPECT_EQ(answers["roots/list"], nlohmann::json::parse(R"({"result": {"roots": [
                {"uri": "file:///work", "name": "/work"},
                {"uri": "file:///work/a%20dir", "name": "/work/a dir"}]}})"))
      << answers;
  auto refused = [](const std::string& message) {
    return nlohmann::json{{"error", {{"code", -32601}, {"message", message}}}};
  };
  EXPECT_EQ(answers["sampling/createMessage"],
            refused("sampling/createMessage: this client offers no sampling (it declared no "
                    "'sampling' capability)"))
      << answers;
  EXPECT_EQ(answers["elicitation/create"], refused("method not found: elicitation/create"))
      << answers;
  // The conversation goes on.
  StatusOr<ToolResult> r =
      (*f.client)->CallTool(ToolCall{"c1", "echo", R"({"text": "after"})"}, DeadlineIn(30));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->content, "after");
}

// The tool the fake server offers only as a task is named once in the log, however many
// episodes start the server.
TEST(McpFakeServerTest, ToolsLeftOutAreLoggedOncePerServer) {
  std::unique_ptr<Env> env = WithMcpTools(calc::MakeCalcEnv({}), {FakeServer(10)});
  testing::internal::CaptureStderr();
  for (int i = 0; i < 2; ++i) {
    StatusOr<std::unique_ptr<Episode>> ep =
        env->Reset(*env->Task(Split::kTrain, 0), DeadlineIn(30));
    EXPECT_TRUE(ep.ok()) << ep.status().ToString();
  }
  const std::string log = testing::internal::GetCapturedStderr();
  const std::string line =
      "MCP server 'fake': 1 tool(s) not offered (they must be called as tasks, which Orrery's "
      "client does not speak): needs_task";
  const size_t first = log.find(line);
  EXPECT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find(line, first + 1), std::string::npos) << log;
}

TEST(McpContentTest, ImagesAndResourcesAreDescribedForTheModel) {
  const ToolResult r = ReadMcpToolCallResult(R"({"content": [
      {"type": "text", "text": "look:"},
      {"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo="},
      {"type": "audio", "mimeType": "audio/wav", "data": "UklGRg=="},
      {"type": "resource", "resource": {"uri": "file:///work/a.txt", "mimeType": "text/plain",
                                        "text": "alpha"}},
      {"type": "resource", "resource": {"uri": "file:///work/b.bin", "blob": "AAECAw=="}},
      {"type": "resource_link", "uri": "file:///work/c.md", "name": "c.md",
       "mimeType": "text/markdown", "description": "notes"},
      {"type": "resource_link", "uri": "file:///work/d"},
      {"type": "image"},
      {"type": "hologram"}]})",
                                             "fake");
  EXPECT_FALSE(r.is_error);
  EXPECT_EQ(r.content,
            "look:\n"
            "[image: image/png, 8 bytes]\n"
            "[audio: audio/wav, 4 bytes]\n"
            "[resource: file:///work/a.txt, text/plain]\nalpha\n"
            "[resource: file:///work/b.bin, 4 bytes]\n"
            "[resource link: c.md, file:///work/c.md, text/markdown: notes]\n"
            "[resource link: file:///work/d]\n"
            "[image: unknown type, 0 bytes]\n"
            "[hologram content]");
  // Structured content alone reads as its JSON.
  EXPECT_EQ(
      ReadMcpToolCallResult(R"({"content": [], "structuredContent": {"sum": 3}})", "fake").content,
      R"({"sum":3})");
}

}  // namespace
}  // namespace orrery::env
