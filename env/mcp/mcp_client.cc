#include "env/mcp/mcp_client.h"

#include <cctype>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/json_text.h"
#include "core/logging.h"
#include "env/tool_call.h"

namespace orrery::env {

using nlohmann::json;

namespace {

Deadline Earlier(Deadline a, double seconds) { return std::min(a, DeadlineIn(seconds)); }

std::string StringField(const json& object, const char* key) {
  return object.is_object() && object.contains(key) && object[key].is_string()
             ? object[key].get<std::string>()
             : "";
}

// An outside string for a one-line message: control characters as '?', at most 80 bytes.
std::string OneLineQuote(const std::string& text) {
  std::string out = text.substr(0, 80);
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return out;
}

std::string SupportedVersions() {
  std::string out;
  for (const char* v : kMcpProtocolVersions) out += (out.empty() ? "" : ", ") + std::string(v);
  return out;
}

// "file://" and the path, bytes outside RFC 3986's unreserved set and '/' percent-encoded.
std::string FileUri(const std::string& path) {
  static const char* const kHex = "0123456789ABCDEF";
  std::string uri = "file://";
  for (unsigned char c : path) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || c == '/') {
      uri += static_cast<char>(c);
    } else {
      uri += {'%', kHex[c >> 4], kHex[c & 15]};
    }
  }
  return uri;
}

// The size of base64 `data` once decoded (padding and whitespace not counted).
size_t Base64Bytes(const std::string& data) {
  size_t symbols = 0;
  for (unsigned char c : data)
    symbols += std::isalnum(c) || c == '+' || c == '/' || c == '-' || c == '_';
  return symbols * 3 / 4;
}

// "[<what>: a, b, c]" of the non-empty fields.
std::string Bracketed(const std::string& what, const std::vector<std::string>& fields,
                      const std::string& tail = "") {
  std::string out = "[" + what + ":";
  const char* sep = " ";
  for (const std::string& f : fields) {
    if (f.empty()) continue;
    out += sep + f;
    sep = ", ";
  }
  return out + (tail.empty() ? "" : ": " + tail) + "]";
}

// One content part as the model reads it (ReadMcpToolCallResult's contract).
std::string DescribeContent(const json& part) {
  const std::string type =
      part.contains("type") && part["type"].is_string() ? part["type"].get<std::string>() : "part";
  if (type == "text" && part.contains("text") && part["text"].is_string()) {
    return part["text"].get<std::string>();
  }
  if (type == "image" || type == "audio") {
    const std::string mime = StringField(part, "mimeType");
    return Bracketed(type, {mime.empty() ? "unknown type" : mime,
                            std::to_string(Base64Bytes(StringField(part, "data"))) + " bytes"});
  }
  if (type == "resource" && part.contains("resource") && part["resource"].is_object()) {
    const json& r = part["resource"];
    const std::string uri = StringField(r, "uri"), mime = StringField(r, "mimeType");
    if (r.contains("text") && r["text"].is_string()) {
      return Bracketed("resource", {uri, mime}) + "\n" + r["text"].get<std::string>();
    }
    return Bracketed("resource",
                     {uri, mime, std::to_string(Base64Bytes(StringField(r, "blob"))) + " bytes"});
  }
  if (type == "resource_link") {
    return Bracketed(
        "resource link",
        {StringField(part, "name"), StringField(part, "uri"), StringField(part, "mimeType")},
        StringField(part, "description"));
  }
  return "[" + type + " content]";
}

}  // namespace

StatusOr<McpSession> ReadMcpInitializeResult(const std::string& result, const std::string& server) {
  json r = ParseUntrustedJson(result);
  McpSession session;
  session.server_name =
      r.is_object() && r.contains("serverInfo") ? StringField(r["serverInfo"], "name") : "";
  session.protocol_version = StringField(r, "protocolVersion");
  if (session.protocol_version.empty()) {
    return FailedPreconditionError("MCP server '" + server +
                                   "': initialize result without a 'protocolVersion'");
  }
  for (const char* v : kMcpProtocolVersions) {
    if (session.protocol_version == v) return session;
  }
  return FailedPreconditionError(
      "MCP server '" + server + "'" +
      (session.server_name.empty() ? "" : " (" + OneLineQuote(session.server_name) + ")") +
      " answered protocol version '" + OneLineQuote(session.protocol_version) +
      "', which this client does not " + "speak (it offered " + kMcpProtocolVersions[0] +
      "; it speaks " + SupportedVersions() + ")");
}

std::string McpRootsListResult(const std::vector<std::string>& roots) {
  json list = json::array();
  for (const std::string& root : roots) list.push_back({{"uri", FileUri(root)}, {"name", root}});
  return JsonText(json{{"roots", list}});
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
      result.content += DescribeContent(part);
    }
  }
  if (result.content.empty() && r.is_object() && r.contains("structuredContent")) {
    result.content = JsonText(r["structuredContent"]);
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
  McpClient* self = client.get();  // the channel, and with it the handlers, dies with the client
  client->channel_->set_request_handler(
      [self](const std::string& method, const std::string&, Deadline) {
        return self->AnswerServerRequest(method);
      });
  client->channel_->set_notification_handler([name = options.name](const std::string& method,
                                                                   const std::string& params) {
    ORRERY_LOG(DEBUG) << "MCP server '" << name << "': " << method << " " << params.substr(0, 200);
  });
  json capabilities = json::object();
  if (!options.roots.empty()) capabilities["roots"] = {{"listChanged", false}};
  const json init = {{"protocolVersion", kMcpProtocolVersions[0]},
                     {"capabilities", capabilities},
                     {"clientInfo", {{"name", "orrery"}, {"version", "0.1"}}}};
  ORRERY_ASSIGN_OR_RETURN(
      std::string reply,
      client->channel_->Call("initialize", init.dump(), Earlier(deadline, options.call_seconds)));
  ORRERY_ASSIGN_OR_RETURN(client->session_, ReadMcpInitializeResult(reply, options.name));
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
    client->skipped_tools_.insert(client->skipped_tools_.end(), tools.task_only.begin(),
                                  tools.task_only.end());
    if (!tools.next_cursor) break;
    cursor = std::move(*tools.next_cursor);
  }
  return client;
}

StatusOr<std::string> McpClient::AnswerServerRequest(const std::string& method) const {
  if (method == "ping") return std::string("{}");
  if (method == "roots/list" && !options_.roots.empty()) return McpRootsListResult(options_.roots);
  ORRERY_LOG(DEBUG) << "MCP server '" << options_.name << "': refused its request " << method;
  if (method == "sampling/createMessage") {
    return NotFoundError(
        "sampling/createMessage: this client offers no sampling (it declared no "
        "'sampling' capability)");
  }
  return NotFoundError("method not found: " + method);
}

Status McpClient::Ping(Deadline deadline) {
  return channel_->Call("ping", "", Earlier(deadline, options_.call_seconds)).status();
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
    cancelled_call_ = true;
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
