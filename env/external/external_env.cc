#include "env/external/external_env.h"

#include <nlohmann/json.hpp>

#include "core/json_text.h"
#include "env/external/json_rpc_channel.h"
#include "env/external/run_isolated.h"
#include "env/sandbox/sandbox_pool.h"
#include "env/tool_call.h"

namespace orrery::env {
namespace {

using nlohmann::json;

Deadline Earlier(Deadline a, double seconds) { return std::min(a, DeadlineIn(seconds)); }

// A reply's result as JSON; the channel hands back JSON text, but nothing here may throw.
StatusOr<json> ParseReply(const std::string& reply, const std::string& where) {
  json r = ParseUntrustedJson(reply);
  if (r.is_discarded()) return FailedPreconditionError(where + ": result is not valid JSON");
  return r;
}

StatusOr<std::vector<ToolSpec>> ParseTools(const json& tools, const std::string& peer) {
  std::vector<ToolSpec> out;
  if (!tools.is_array()) return FailedPreconditionError(peer + ": reset: 'tools' must be an array");
  for (const json& t : tools) {
    const json& f = t.contains("function") ? t["function"] : t;
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) {
      return FailedPreconditionError(peer + ": reset: a tool needs a string 'name'");
    }
    if (f.contains("description") && !f["description"].is_string()) {
      return FailedPreconditionError(peer + ": reset: tool '" + f["name"].get<std::string>() +
                                     "': 'description' must be a string");
    }
    out.push_back(ToolSpec{f["name"].get<std::string>(), f.value("description", ""),
                           f.contains("parameters") ? JsonText(f["parameters"]) : "{}"});
  }
  return out;
}

// Serves one episode's run_isolated requests (run_isolated.h) in a sandbox of their own: the
// program's options without the /env bind, the episode's slot (so the runs count towards the
// episode's host uid, and no other sandbox's), created at the first request.
class IsolatedRunService {
 public:
  IsolatedRunService(SandboxOptions options, uint32_t slot, double max_seconds)
      : options_(IsolatedSandboxOptions(std::move(options))),
        slot_(slot),
        max_seconds_(max_seconds) {}

  StatusOr<std::string> Serve(const std::string& method, const std::string& params,
                              Deadline deadline) {
    if (method != kRunIsolatedMethod) {
      return NotFoundError("method '" + method + "' is not served (Orrery serves '" +
                           kRunIsolatedMethod + "')");
    }
    ORRERY_ASSIGN_OR_RETURN(RunIsolatedRequest r, ReadRunIsolatedParams(params, max_seconds_));
    if (!sandbox_) {
      ORRERY_ASSIGN_OR_RETURN(sandbox_, Sandbox::Create(options_, slot_));
    }
    ORRERY_ASSIGN_OR_RETURN(std::vector<RunResult> runs,
                            RunIsolated(*sandbox_, r.program, r.inputs, deadline));
    return RunIsolatedResultJson(runs);
  }

 private:
  SandboxOptions options_;
  uint32_t slot_;
  double max_seconds_;
  std::unique_ptr<Sandbox> sandbox_;
};

class ExternalEpisode : public Episode {
 public:
  ExternalEpisode(std::unique_ptr<PooledSandbox> sandbox, std::unique_ptr<IsolatedRunService> runs,
                  std::unique_ptr<JsonRpcChannel> channel, std::vector<ChatMessage> messages,
                  std::vector<ToolSpec> tools, double call_s)
      : sandbox_(std::move(sandbox)),
        runs_(std::move(runs)),
        channel_(std::move(channel)),
        messages_(std::move(messages)),
        tools_(std::move(tools)),
        call_seconds_(call_s) {}
  ~ExternalEpisode() override {
    if (channel_->open()) (void)channel_->Call("close", "{}", DeadlineIn(1));
    channel_.reset();  // kills the process before the sandbox goes back to the pool
  }

  const std::vector<ChatMessage>& initial_messages() const override { return messages_; }
  const std::vector<ToolSpec>& tools() const override { return tools_; }

  StatusOr<ToolResult> Step(const ToolCall& call, Deadline deadline) override {
    const auto start = Clock::now();
    StatusOr<std::string> args = ValidateToolCall(call, tools_);
    if (!args.ok()) return ToolError(args.status().message());
    json params = {
        {"tool_call", {{"id", call.id}, {"name", call.name}, {"arguments", json::parse(*args)}}}};
    ORRERY_ASSIGN_OR_RETURN(std::string reply, channel_->Call("step", JsonText(params),
                                                              Earlier(deadline, call_seconds_)));
    // A malformed reply is the program's fault, but the episode goes on: the model reads it as the
    // call's (error) result, and the rollout is not cut short.
    StatusOr<ToolResult> read = ReadStepResult(reply);
    ToolResult result = read.ok() ? *std::move(read) : ToolError(read.status().message());
    result.latency_s = std::chrono::duration<double>(Clock::now() - start).count();
    return result;
  }

  StatusOr<EpisodeScore> Score(const std::vector<ChatMessage>& trajectory,
                               Deadline deadline) override {
    json params = {{"messages", json::parse(ChatMessagesToJson(trajectory), nullptr, false)}};
    ORRERY_ASSIGN_OR_RETURN(std::string reply, channel_->Call("score", JsonText(params),
                                                              Earlier(deadline, call_seconds_)));
    return ReadScoreResult(reply);
  }

 private:
  std::unique_ptr<PooledSandbox> sandbox_;
  std::unique_ptr<IsolatedRunService> runs_;  // used by channel_'s request handler
  std::unique_ptr<JsonRpcChannel> channel_;
  std::vector<ChatMessage> messages_;
  std::vector<ToolSpec> tools_;
  double call_seconds_;
};

class ExternalEnv : public Env {
 public:
  ExternalEnv(const ExternalEnvOptions& options, std::string name)
      : options_(options),
        name_(std::move(name)),
        pool_(options.sandbox, options.pool_size, 2048) {}
  std::string name() const override { return name_; }

  StatusOr<TaskRef> Task(Split split, uint64_t index) const override {
    return TaskRef{name_ + "/" + std::string(SplitName(split)) + "/" +
                       std::to_string(options_.seed) + "/" + std::to_string(index),
                   split, options_.seed, index};
  }

  StatusOr<std::unique_ptr<Episode>> Reset(const TaskRef& task, Deadline deadline) override {
    ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<PooledSandbox> sandbox, pool_.Acquire(deadline));
    ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<SandboxProcess> proc,
                            (*sandbox)->Start(options_.command));
    auto runs = std::make_unique<IsolatedRunService>(options_.sandbox, (*sandbox)->slot(),
                                                     options_.call_seconds);
    auto channel = std::make_unique<JsonRpcChannel>(std::move(proc), "environment '" + name_ + "'");
    channel->set_request_handler(
        [service = runs.get()](const std::string& method, const std::string& params, Deadline d) {
          return service->Serve(method, params, d);
        });
    json params = {{"task",
                    {{"id", task.id},
                     {"split", std::string(SplitName(task.split))},
                     {"seed", task.seed},
                     {"index", task.index}}}};
    ORRERY_ASSIGN_OR_RETURN(
        std::string reply,
        channel->Call("reset", JsonText(params), Earlier(deadline, options_.call_seconds)));
    ORRERY_ASSIGN_OR_RETURN(ExternalResetResult r,
                            ReadResetResult(reply, "environment '" + name_ + "'"));
    return std::unique_ptr<Episode>(new ExternalEpisode(std::move(sandbox), std::move(runs),
                                                        std::move(channel), std::move(r.messages),
                                                        std::move(r.tools), options_.call_seconds));
  }

 private:
  ExternalEnvOptions options_;
  std::string name_;
  SandboxPool pool_;
};

}  // namespace

StatusOr<std::string> ReadDescribeResult(const std::string& reply, const std::string& peer) {
  ORRERY_ASSIGN_OR_RETURN(json r, ParseReply(reply, peer));
  const std::string protocol = r.is_object() && r.contains("protocol") && r["protocol"].is_string()
                                   ? r["protocol"].get<std::string>()
                                   : std::string();
  if (protocol != kEnvProtocolVersion) {
    return FailedPreconditionError(peer + " speaks protocol '" + protocol + "', expected '" +
                                   kEnvProtocolVersion + "'");
  }
  if (r.contains("name") && !r["name"].is_string()) {
    return FailedPreconditionError(peer + ": describe: 'name' must be a string");
  }
  return r.value("name", "external");
}

StatusOr<ExternalResetResult> ReadResetResult(const std::string& reply, const std::string& peer) {
  ORRERY_ASSIGN_OR_RETURN(json r, ParseReply(reply, peer + ": reset"));
  if (!r.is_object() || !r.contains("messages")) {
    return FailedPreconditionError(peer + ": reset: result needs 'messages'");
  }
  StatusOr<std::vector<ChatMessage>> messages = ChatMessagesFromJson(JsonText(r["messages"]));
  if (!messages.ok()) return messages.status().WithContext(peer + ": reset");
  ORRERY_ASSIGN_OR_RETURN(std::vector<ToolSpec> tools,
                          ParseTools(r.value("tools", json::array()), peer));
  return ExternalResetResult{std::move(*messages), std::move(tools)};
}

StatusOr<ToolResult> ReadStepResult(const std::string& reply) {
  ORRERY_ASSIGN_OR_RETURN(json r, ParseReply(reply, "environment step"));
  if (!r.is_object() || !r.contains("content") || !r["content"].is_string()) {
    return FailedPreconditionError("environment step: result needs a string 'content'");
  }
  ToolResult result;
  result.content = r["content"].get<std::string>();
  if (r.contains("is_error") && !r["is_error"].is_boolean()) {
    return FailedPreconditionError("environment step: 'is_error' must be a boolean");
  }
  result.is_error = r.value("is_error", false);
  return result;
}

StatusOr<EpisodeScore> ReadScoreResult(const std::string& reply) {
  ORRERY_ASSIGN_OR_RETURN(json r, ParseReply(reply, "environment score"));
  if (!r.is_object() || !r.contains("reward") || !r["reward"].is_number()) {
    return FailedPreconditionError("environment score: result needs a number 'reward'");
  }
  EpisodeScore score;
  score.reward = r["reward"].get<double>();
  if (r.contains("components") && r["components"].is_object()) {
    for (auto it = r["components"].begin(); it != r["components"].end(); ++it) {
      if (it.value().is_number()) score.components[it.key()] = it.value().get<double>();
    }
  }
  return score;
}

ExternalEnvOptions ReadExternalEnvOptions(ConfigTable& table, const EnvDemand& demand) {
  ExternalEnvOptions o;
  o.dir = table.Path("dir", "");
  o.command = table.StringList("command", {});
  if (o.command.empty()) table.Fail("command", "expected a non-empty list of strings (argv)");
  o.seed = static_cast<uint64_t>(table.Int("seed", 0, 0));
  o.call_seconds = table.Float("wall_seconds", 30, 0.1, 3600);
  o.pool_size = ReadPoolSize(table, demand, 1024);
  o.sandbox.limits.address_space_bytes = table.Int("memory_mb", 1024, 64, 1 << 20) << 20;
  o.sandbox.limits.wall_seconds = o.call_seconds;
  return o;
}

StatusOr<std::unique_ptr<Env>> MakeExternalEnv(const ExternalEnvOptions& in) {
  ExternalEnvOptions options = in;
  if (options.command.empty()) return InvalidArgumentError("external environment: empty command");
  if (!options.dir.empty()) options.sandbox.ro_binds.emplace_back(options.dir, "/env");
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<Sandbox> sandbox, Sandbox::Create(options.sandbox, 2047));
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<SandboxProcess> proc, sandbox->Start(options.command));
  std::string shown;
  for (const std::string& a : options.command) shown += (shown.empty() ? "" : " ") + a;
  JsonRpcChannel channel(std::move(proc), "external environment (" + shown + ")");
  ORRERY_ASSIGN_OR_RETURN(std::string reply,
                          channel.Call("describe", "{}", DeadlineIn(options.call_seconds)));
  ORRERY_ASSIGN_OR_RETURN(const std::string name,
                          ReadDescribeResult(reply, "external environment (" + shown + ")"));
  (void)channel.Call("close", "{}", DeadlineIn(1));
  return std::unique_ptr<Env>(std::make_unique<ExternalEnv>(options, name));
}

}  // namespace orrery::env
