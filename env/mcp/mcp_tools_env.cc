#include "env/mcp/mcp_tools_env.h"

#include <set>

#include "env/sandbox/sandbox_pool.h"
#include "env/tool_call.h"

namespace orrery::env {
namespace {

struct Attached {
  std::unique_ptr<PooledSandbox> sandbox;
  std::unique_ptr<McpClient> client;
};

class McpEpisode : public Episode {
 public:
  McpEpisode(std::unique_ptr<Episode> inner, std::vector<Attached> servers,
             std::vector<ToolSpec> tools)
      : inner_(std::move(inner)), servers_(std::move(servers)), tools_(std::move(tools)) {}
  ~McpEpisode() override {
    for (Attached& a : servers_) a.client.reset();  // stop servers before sandboxes go back
  }
  const std::vector<ChatMessage>& initial_messages() const override {
    return inner_->initial_messages();
  }
  const std::vector<ToolSpec>& tools() const override { return tools_; }
  StatusOr<ToolResult> Step(const ToolCall& call, Deadline deadline) override {
    for (Attached& a : servers_) {
      if (a.client->HasTool(call.name)) return a.client->CallTool(call, deadline);
    }
    bool inner_tool = false;
    for (const ToolSpec& t : inner_->tools()) inner_tool = inner_tool || t.name == call.name;
    if (!inner_tool) {  // unknown: the model reads every tool it has, the servers' too
      StatusOr<std::string> unknown = ValidateToolCall(call, tools_);
      return ToolError(unknown.status().message());
    }
    return inner_->Step(call, deadline);
  }
  StatusOr<EpisodeScore> Score(const std::vector<ChatMessage>& trajectory,
                               Deadline deadline) override {
    return inner_->Score(trajectory, deadline);
  }

 private:
  std::unique_ptr<Episode> inner_;
  std::vector<Attached> servers_;
  std::vector<ToolSpec> tools_;
};

class McpToolsEnv : public Env {
 public:
  McpToolsEnv(std::unique_ptr<Env> inner, std::vector<McpAttachment> servers)
      : inner_(std::move(inner)), servers_(std::move(servers)) {
    uint32_t slot = 3072;
    for (McpAttachment& s : servers_) {
      if (!s.dir.empty()) s.sandbox.ro_binds.emplace_back(s.dir, "/mcp");
      pools_.push_back(std::make_unique<SandboxPool>(s.sandbox, s.pool_size, slot));
      slot += static_cast<uint32_t>(s.pool_size);
    }
  }
  std::string name() const override { return inner_->name(); }
  StatusOr<TaskRef> Task(Split split, uint64_t index) const override {
    return inner_->Task(split, index);
  }
  StatusOr<std::unique_ptr<Episode>> Reset(const TaskRef& task, Deadline deadline) override {
    ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<Episode> inner, inner_->Reset(task, deadline));
    std::vector<ToolSpec> tools = inner->tools();
    std::set<std::string> names;
    for (const ToolSpec& t : tools) names.insert(t.name);
    std::vector<Attached> attached;
    for (size_t i = 0; i < servers_.size(); ++i) {
      Attached a;
      ORRERY_ASSIGN_OR_RETURN(a.sandbox, pools_[i]->Acquire(deadline));
      ORRERY_ASSIGN_OR_RETURN(a.client,
                              McpClient::Start(**a.sandbox, servers_[i].server, deadline));
      for (const ToolSpec& t : a.client->tools()) {
        if (!names.insert(t.name).second) {
          return FailedPreconditionError("MCP server '" + servers_[i].server.name +
                                         "' offers a tool named '" + t.name +
                                         "', which the environment already has");
        }
        tools.push_back(t);
      }
      attached.push_back(std::move(a));
    }
    return std::unique_ptr<Episode>(
        new McpEpisode(std::move(inner), std::move(attached), std::move(tools)));
  }

 private:
  std::unique_ptr<Env> inner_;
  std::vector<McpAttachment> servers_;
  std::vector<std::unique_ptr<SandboxPool>> pools_;
};

}  // namespace

std::vector<McpAttachment> ReadMcpAttachments(ConfigTable& env_table, const EnvDemand& demand) {
  std::vector<McpAttachment> out;
  for (ConfigTable& t : env_table.TableArray("mcp")) {
    McpAttachment a;
    a.server.name = t.RequiredString("name");
    a.server.command = t.StringList("command", {});
    if (a.server.command.empty()) t.Fail("command", "expected a non-empty list of strings (argv)");
    a.server.call_seconds = t.Float("wall_seconds", 30, 0.1, 3600);
    a.dir = t.Path("dir", "");
    a.pool_size = ReadPoolSize(t, demand, 1024);
    a.sandbox.limits.wall_seconds = 3600;  // servers live for the episode
    a.sandbox.limits.address_space_bytes = t.Int("memory_mb", 16384, 64, 1 << 20) << 20;
    a.sandbox.limits.open_files = t.Int("open_files", 1024, 16, 1 << 20);
    out.push_back(std::move(a));
  }
  return out;
}

std::unique_ptr<Env> WithMcpTools(std::unique_ptr<Env> inner, std::vector<McpAttachment> servers) {
  if (servers.empty()) return inner;
  return std::make_unique<McpToolsEnv>(std::move(inner), std::move(servers));
}

}  // namespace orrery::env
