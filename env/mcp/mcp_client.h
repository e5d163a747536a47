// An MCP (Model Context Protocol) client: the tools of any MCP server, for any environment.
//
// Speaks JSON-RPC 2.0 over the server's stdio (the MCP stdio transport) through JsonRpcChannel:
// `initialize`, the `notifications/initialized` notification, `tools/list` (following
// `nextCursor` pages), `tools/call` and `ping`. The server runs inside a sandbox like every other
// plug-in process.
//
// Session. `initialize` offers kMcpProtocolVersions[0]; the server's answer must be one of
// kMcpProtocolVersions, otherwise Start fails with one line naming the server and both versions.
// The client declares one capability, `roots` (listChanged false), when it has roots to give, and
// neither `sampling` nor `elicitation`: the model is the only LLM here and no person is asked.
// Requests the server sends while a call waits are answered, so a server never hangs on one:
// `ping` with an empty result, `roots/list` with the roots (McpServerOptions::roots as file://
// URIs), anything else (`sampling/createMessage`, `elicitation/create`, ...) with JSON-RPC error
// -32601. Notifications from the server are logged at debug level and otherwise ignored.
//
// Tools. A tool's `inputSchema` becomes the ToolSpec parameters, so calls are validated before
// they reach the server. A tool that must be called as a task (`execution.taskSupport =
// "required"`, MCP's task augmentation, which this client does not speak) is left out of the
// tools (skipped_tools() names them): the model could never call it. A result's content parts
// become text the model reads (ReadMcpToolCallResult); `isError` maps to is_error. A call the
// server does not answer within its deadline is a tool error the model reads, and the server is
// told to cancel it (notifications/cancelled); the episode goes on.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "env/env.h"
#include "env/external/json_rpc_channel.h"
#include "env/sandbox/sandbox.h"

namespace orrery::env {

// The protocol versions this client speaks, newest first; the first is the one it offers.
inline constexpr const char* kMcpProtocolVersions[] = {"2025-06-18", "2025-03-26", "2024-11-05"};

struct McpServerOptions {
  std::string name;                  // for messages and config ("fs")
  std::vector<std::string> command;  // argv inside the sandbox
  double call_seconds = 30;          // deadline of each request when the caller's is later
  // Directories inside the sandbox the server may work in, answered to `roots/list` as file://
  // URIs; empty: the client declares no `roots` capability.
  std::vector<std::string> roots = {"/work"};
};

// The readers of a server's results (JSON text, ReadJsonRpcResponse's output); none throws,
// whatever the text. `server` is McpServerOptions::name. Exposed for the fuzz tests.
struct McpSession {
  std::string protocol_version;  // the version the server answered (one of kMcpProtocolVersions)
  std::string server_name;       // serverInfo.name, or "" when absent
};
// An `initialize` result; FailedPrecondition when it names no protocol version or one this client
// does not speak.
StatusOr<McpSession> ReadMcpInitializeResult(const std::string& result, const std::string& server);
// The `roots/list` result for `roots` (absolute paths inside the sandbox).
std::string McpRootsListResult(const std::vector<std::string>& roots);
struct McpToolsPage {
  std::vector<ToolSpec> tools;             // the entries with a string "name"; others are skipped
  std::vector<std::string> task_only;      // skipped too: tools that must be called as tasks
  std::optional<std::string> next_cursor;  // absent on the last page
};
StatusOr<McpToolsPage> ReadMcpToolsList(const std::string& result, const std::string& server);
// A `tools/call` result as the ToolResult the model reads (latency_s left 0). Content parts are
// joined with newlines: text as it is; an image or audio part as "[image: image/png, 1234
// bytes]"; an embedded text resource as "[resource: <uri>, <mimeType>]" and its text on the next
// line, a blob resource as "[resource: <uri>, <mimeType>, N bytes]"; a resource link as
// "[resource link: <name>, <uri>, <mimeType>: <description>]" (absent fields left out); any other
// part as "[<type> content]". A result without content parts but with `structuredContent` reads
// as that JSON.
ToolResult ReadMcpToolCallResult(const std::string& result, const std::string& server);

class McpClient {
 public:
  // Starts the server in `sandbox` and runs initialize (with the version negotiation) and
  // tools/list.
  static StatusOr<std::unique_ptr<McpClient>> Start(Sandbox& sandbox,
                                                    const McpServerOptions& options,
                                                    Deadline deadline);
  const std::vector<ToolSpec>& tools() const { return tools_; }
  // The tools of tools/list left out because they must be called as tasks.
  const std::vector<std::string>& skipped_tools() const { return skipped_tools_; }
  const McpSession& session() const { return session_; }
  bool HasTool(const std::string& name) const;
  // Validates the arguments against the tool's schema, then tools/call. Model mistakes and tool
  // errors are error ToolResults; a Status error means the server failed.
  StatusOr<ToolResult> CallTool(const ToolCall& call, Deadline deadline);
  // `ping`: OK when the server answers in time (a kept server is checked before it is reused).
  Status Ping(Deadline deadline);
  // Whether the server can serve another episode: it has not failed and no call of it was
  // cancelled (a cancelled call may still be running).
  bool reusable() const { return channel_->open() && !cancelled_call_; }

 private:
  McpClient(std::unique_ptr<JsonRpcChannel> channel, McpServerOptions options)
      : channel_(std::move(channel)), options_(std::move(options)) {}
  // Answers a request from the server (see the top of this file).
  StatusOr<std::string> AnswerServerRequest(const std::string& method) const;

  std::unique_ptr<JsonRpcChannel> channel_;
  McpServerOptions options_;
  McpSession session_;
  std::vector<ToolSpec> tools_;
  std::vector<std::string> skipped_tools_;
  bool cancelled_call_ = false;
};

}  // namespace orrery::env
