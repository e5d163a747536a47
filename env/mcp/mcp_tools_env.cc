#include "env/mcp/mcp_tools_env.h"

#include <condition_variable>
#include <mutex>
#include <set>

#include "core/logging.h"
#include "env/sandbox/sandbox_pool.h"
#include "env/tool_call.h"

namespace orrery::env {
namespace {

// A server running in its sandbox.
struct Running {
  std::unique_ptr<PooledSandbox> sandbox;
  // Declared last, so destroyed first: the server stops before its sandbox goes back.
  std::unique_ptr<McpClient> client;
};

class ServerLease;

// One [[env.mcp]] server: its sandbox pool and, with reuse_server, the servers kept running
// between episodes. Thread-safe.
class ServerSource {
 public:
  ServerSource(McpAttachment config, uint32_t first_slot)
      : config_(std::move(config)), pool_(config_.sandbox, config_.pool_size, first_slot) {}
  const McpAttachment& config() const { return config_; }
  // A running server for one episode: a kept one that answers `ping`, else a fresh one; waits
  // for a sandbox until `deadline`.
  StatusOr<std::unique_ptr<ServerLease>> Take(Deadline deadline);

 private:
  friend class ServerLease;
  // Back from an episode: kept with reuse_server when it can serve another, else stopped.
  void Give(Running running);
  // Stops `running` (its sandbox goes back to the pool) and frees its place.
  void Stop(Running running);

  const McpAttachment config_;
  SandboxPool pool_;
  std::once_flag skipped_logged_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Running> kept_;
  int held_ = 0;  // sandboxes out of the pool: with episodes, kept, or being started
};

// A running server on loan to an episode; goes back to its source when destroyed.
class ServerLease {
 public:
  ServerLease(ServerSource* source, Running running)
      : source_(source), running_(std::move(running)) {}
  ~ServerLease() { source_->Give(std::move(running_)); }
  ServerLease(const ServerLease&) = delete;
  ServerLease& operator=(const ServerLease&) = delete;
  McpClient& client() const { return *running_.client; }

 private:
  ServerSource* source_;
  Running running_;
};

StatusOr<std::unique_ptr<ServerLease>> ServerSource::Take(Deadline deadline) {
  const std::string& name = config_.server.name;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (!kept_.empty()) {
      Running kept = std::move(kept_.back());
      kept_.pop_back();
      lock.unlock();
      Status alive = kept.client->Ping(deadline);
      if (alive.ok()) return std::make_unique<ServerLease>(this, std::move(kept));
      ORRERY_LOG(INFO) << "MCP server '" << name
                       << "': a kept server did not answer ping; starting a new one ("
                       << alive.message() << ")";
      Stop(std::move(kept));
      lock.lock();
      continue;
    }
    if (held_ < config_.pool_size) break;
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && kept_.empty() &&
        held_ >= config_.pool_size) {
      return DeadlineExceededError("MCP server '" + name +
                                   "': no free sandbox before the deadline (pool of " +
                                   std::to_string(config_.pool_size) + ")");
    }
  }
  ++held_;
  lock.unlock();
  Running fresh;
  StatusOr<std::unique_ptr<PooledSandbox>> sandbox = pool_.Acquire(deadline);
  if (!sandbox.ok()) {
    Stop(std::move(fresh));
    return sandbox.status();
  }
  fresh.sandbox = *std::move(sandbox);
  StatusOr<std::unique_ptr<McpClient>> client =
      McpClient::Start(**fresh.sandbox, config_.server, deadline);
  if (!client.ok()) {
    Stop(std::move(fresh));
    return client.status();
  }
  fresh.client = *std::move(client);
  const std::vector<std::string>& skipped = fresh.client->skipped_tools();
  if (!skipped.empty()) {
    std::call_once(skipped_logged_, [&] {
      std::string names;
      for (const std::string& t : skipped) names += (names.empty() ? "" : ", ") + t;
      ORRERY_LOG(INFO) << "MCP server '" << name << "': " << skipped.size()
                       << " tool(s) not offered (they must be called as tasks, which Orrery's "
                          "client does not speak): "
                       << names;
    });
  }
  return std::make_unique<ServerLease>(this, std::move(fresh));
}

void ServerSource::Give(Running running) {
  if (!config_.reuse_server || !running.client->reusable()) {
    return Stop(std::move(running));
  }
  Status emptied = (*running.sandbox)->Reset();
  if (!emptied.ok()) {
    ORRERY_LOG(WARN) << "MCP server '" << config_.server.name
                     << "': not kept: " << emptied.message();
    return Stop(std::move(running));
  }
  std::lock_guard<std::mutex> lock(mu_);
  kept_.push_back(std::move(running));
  cv_.notify_one();
}

void ServerSource::Stop(Running running) {
  running.client.reset();
  running.sandbox.reset();
  std::lock_guard<std::mutex> lock(mu_);
  --held_;
  cv_.notify_one();
}

class McpEpisode : public Episode {
 public:
  McpEpisode(std::unique_ptr<Episode> inner, std::vector<std::unique_ptr<ServerLease>> servers,
             std::vector<ToolSpec> tools)
      : inner_(std::move(inner)), servers_(std::move(servers)), tools_(std::move(tools)) {}
  const std::vector<ChatMessage>& initial_messages() const override {
    return inner_->initial_messages();
  }
  const std::vector<ToolSpec>& tools() const override { return tools_; }
  StatusOr<ToolResult> Step(const ToolCall& call, Deadline deadline) override {
    for (const std::unique_ptr<ServerLease>& s : servers_) {
      if (s->client().HasTool(call.name)) return s->client().CallTool(call, deadline);
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
  std::vector<std::unique_ptr<ServerLease>> servers_;
  std::vector<ToolSpec> tools_;
};

class McpToolsEnv : public Env {
 public:
  McpToolsEnv(std::unique_ptr<Env> inner, std::vector<McpAttachment> servers)
      : inner_(std::move(inner)) {
    uint32_t slot = 3072;
    for (McpAttachment& s : servers) {
      if (!s.dir.empty()) s.sandbox.ro_binds.emplace_back(s.dir, "/mcp");
      const int size = s.pool_size;
      sources_.push_back(std::make_unique<ServerSource>(std::move(s), slot));
      slot += static_cast<uint32_t>(size);
    }
  }
  std::string name() const override { return inner_->name(); }
  StatusOr<TaskRef> Task(Split split, uint64_t index) const override {
    return inner_->Task(split, index);
  }
  std::string Family(const TaskRef& task) const override { return inner_->Family(task); }
  StatusOr<std::unique_ptr<Episode>> Reset(const TaskRef& task, Deadline deadline) override {
    ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<Episode> inner, inner_->Reset(task, deadline));
    std::vector<ToolSpec> tools = inner->tools();
    std::set<std::string> names;
    for (const ToolSpec& t : tools) names.insert(t.name);
    std::vector<std::unique_ptr<ServerLease>> servers;
    for (const std::unique_ptr<ServerSource>& source : sources_) {
      ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<ServerLease> lease, source->Take(deadline));
      for (const ToolSpec& t : lease->client().tools()) {
        if (!names.insert(t.name).second) {
          return FailedPreconditionError("MCP server '" + source->config().server.name +
                                         "' offers a tool named '" + t.name +
                                         "', which the environment already has");
        }
        tools.push_back(t);
      }
      servers.push_back(std::move(lease));
    }
    return std::unique_ptr<Episode>(
        new McpEpisode(std::move(inner), std::move(servers), std::move(tools)));
  }

 private:
  std::unique_ptr<Env> inner_;
  std::vector<std::unique_ptr<ServerSource>> sources_;
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
    a.server.roots = t.StringList("roots", a.server.roots);
    for (const std::string& root : a.server.roots) {
      if (root.empty() || root[0] != '/') {
        t.Fail("roots",
               "expected absolute paths inside the sandbox (as \"/work\"), got '" + root + "'");
      }
    }
    a.pool_size = ReadPoolSize(t, demand, 1024);
    a.reuse_server = t.Bool("reuse_server", false);
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
