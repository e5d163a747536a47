#include "env/mcp/mcp_client.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/json_text.h"
#include "env/tool_call.h"

namespace orrery::env {

using nlohmann::json;

namespace {
Deadline Earlier(Deadline a, double seconds) { return std::min(a, DeadlineIn(seconds)); }
}  // namespace

std::string ReadMcpServerName(const std::string& result) {
  json r = ParseUntrustedJson(result);
  if (r.is_object() && r.contains("serverInfo") && r["serverInfo"].is_object() &&
      r["serverInfo"].contains("name") && r["serverInfo"]["name"].is_string()) {
    return r["serverInfo"]["name"].get<std::string>();
  }
  return "";
}

StatusOr<McpToolsPage> ReadMcpToolsList(const std::string& result, const std::string& server) {
  json l = ParseUntrustedJson(result);
  if (!l.is_object() || !l.contains("tools") || !l["tools"].is_array()) {
    return FailedPreconditionError("MCP server '" + server + "': tools/list without 'tools'");
  }
  McpToolsPage page;
  for (const json& t : l["tools"]) {
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) continue;
    if (t.contains("execution") && t["execution"].is_object() &&
        t["execution"].value("taskSupport", json()) == "required") {
      page.task_only.push_back(t["name"].get<std::string>());
      continue;
    }
    page.tools.push_back(
        ToolSpec{t["name"].get<std::string>(),
                 t.contains("description") && t["description"].is_string()
                     ? t["description"].get<std::string>()
                     : "",
                 t.contains("inputSchema") ? JsonText(t["inputSchema"]) : "{\"type\":\"object\"}"});
  }
  if (l.contains("nextCursor") && l["nextCursor"].is_string()) {
    page.next_cursor = l["nextCursor"].get<std::string>();
  }
  return page;
}

ToolResult ReadMcpToolCallResult(const std::string& reply, const std::string& server) {
  // The server's reply is read with type checks: a wrong type is a tool error, never a throw.
  ToolResult result;
  json r = ParseUntrustedJson(reply);
  if (r.is_object() && r.contains("content") && r["content"].is_array()) {
    for (const json& part : r["content"]) {
      if (!part.is_object()) continue;
      if (!result.content.empty()) result.content += "\n";
      const std::string type = part.contains("type") && part["type"].is_string()
                                   ? part["type"].get<std::string>()
                                   : "part";
      if (type == "text" && part.contains("text") && part["text"].is_string()) {
        result.content += part["text"].get<std::string>();
      } else {
        result.content += "[" + type + " content]";
      }
    }
  }
  if (r.is_object() && r.contains("isError") && !r["isError"].is_boolean()) {
    return ToolError("MCP server '" + server + "': tools/call: 'isError' must be a boolean");
  }
  result.is_error = r.is_object() && r.value("isError", false);
  return result;
}

StatusOr<std::unique_ptr<McpClient>> McpClient::Start(Sandbox& sandbox,
                                                      const McpServerOptions& options,
                                                      Deadline deadline) {
  if (options.command.empty()) {
    return InvalidArgumentError("MCP server '" + options.name + "': empty command");
  }
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<SandboxProcess> proc, sandbox.Start(options.command));
  auto channel = std::make_unique<JsonRpcChannel>(
      std::move(proc), "MCP server '" + options.name + "'", JsonRpcChannel::OnDeadline::kKeepOpen);
  std::unique_ptr<McpClient> client(new McpClient(std::move(channel), options));
  const json init = {{"protocolVersion", kMcpProtocolVersion},
                     {"capabilities", json::object()},
                     {"clientInfo", {{"name", "orrery"}, {"version", "0.1"}}}};
  ORRERY_ASSIGN_OR_RETURN(
      std::string reply,
      client->channel_->Call("initialize", init.dump(), Earlier(deadline, options.call_seconds)));
  client->server_name_ = ReadMcpServerName(reply);
  ORRERY_RETURN_IF_ERROR(client->channel_->Notify("notifications/initialized", "",
                                                  Earlier(deadline, options.call_seconds)));
  std::string cursor;
  for (int page = 0; page < 100; ++page) {
    json params = json::object();
    if (!cursor.empty()) params["cursor"] = cursor;
    ORRERY_ASSIGN_OR_RETURN(std::string list,
                            client->channel_->Call("tools/list", params.dump(),
                                                   Earlier(deadline, options.call_seconds)));
    ORRERY_ASSIGN_OR_RETURN(McpToolsPage tools, ReadMcpToolsList(list, options.name));
    client->tools_.insert(client->tools_.end(), std::make_move_iterator(tools.tools.begin()),
                          std::make_move_iterator(tools.tools.end()));
    if (!tools.next_cursor) break;
    cursor = std::move(*tools.next_cursor);
  }
  return client;
}

bool McpClient::HasTool(const std::string& name) const {
  for (const ToolSpec& t : tools_) {
    if (t.name == name) return true;
  }
  return false;
}

StatusOr<ToolResult> McpClient::CallTool(const ToolCall& call, Deadline deadline) {
  const auto start = Clock::now();
  StatusOr<std::string> args = ValidateToolCall(call, tools_);
  if (!args.ok()) return ToolError(args.status().message());
  const json params = {{"name", call.name}, {"arguments", json::parse(*args)}};
  StatusOr<std::string> reply =
      channel_->Call("tools/call", JsonText(params), Earlier(deadline, options_.call_seconds));
  ToolResult result;
  if (!reply.ok() && reply.status().code() == StatusCode::kDeadlineExceeded && channel_->open()) {
    // A slow tool is the model's to read (it may try something cheaper); the late reply, if any,
    // carries the old id and is skipped.
    const json cancel = {{"requestId", channel_->last_id()}, {"reason", "deadline exceeded"}};
    (void)channel_->Notify("notifications/cancelled", cancel.dump(), DeadlineIn(1));
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%.3g", waited);
    result = ToolError("MCP server '" + options_.name + "': tool '" + call.name +
                       "' did not answer within " + seconds + " s; the call was cancelled");
  } else if (!reply.ok()) {
    // A JSON-RPC error for one call (unknown tool, bad arguments) is the model's to read; a dead
    // server is the environment's failure.
    if (reply.status().code() != StatusCode::kFailedPrecondition) return reply.status();
    result = ToolError(reply.status().message());
  } else {
    result = ReadMcpToolCallResult(*reply, options_.name);
  }
  result.latency_s = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace orrery::env
