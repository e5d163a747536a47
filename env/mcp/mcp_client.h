// An MCP (Model Context Protocol) client: the tools of any MCP server, for any environment.
//
// Speaks JSON-RPC 2.0 over the server's stdio (the MCP stdio transport) through JsonRpcChannel:
// `initialize` (protocol version 2024-11-05, no client capabilities), the `notifications/
// initialized` notification, `tools/list` (following `nextCursor` pages) and `tools/call`. The
// server runs inside a sandbox like every other plug-in process. A tool's `inputSchema` becomes
// the ToolSpec parameters, so calls are validated before they reach the server; a tool result's
// text content parts are joined into the ToolResult, `isError` maps to is_error. A tool that must
// be called as a task (`execution.taskSupport = "required"`, MCP's task augmentation, which this
// client does not speak) is left out of the tools: the model could never call it. A call the
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

inline constexpr const char* kMcpProtocolVersion = "2024-11-05";

struct McpServerOptions {
  std::string name;                  // for messages and config ("fs")
  std::vector<std::string> command;  // argv inside the sandbox
  double call_seconds = 30;          // deadline of each request when the caller's is later
};

// The readers of a server's results (JSON text, ReadJsonRpcResponse's output); none throws,
// whatever the text. `server` is McpServerOptions::name. Exposed for the fuzz tests.
// serverInfo.name of an `initialize` result, or "" when absent.
std::string ReadMcpServerName(const std::string& result);
struct McpToolsPage {
  std::vector<ToolSpec> tools;             // the entries with a string "name"; others are skipped
  std::vector<std::string> task_only;      // skipped too: tools that must be called as tasks
  std::optional<std::string> next_cursor;  // absent on the last page
};
StatusOr<McpToolsPage> ReadMcpToolsList(const std::string& result, const std::string& server);
// A `tools/call` result as the ToolResult the model reads (latency_s left 0).
ToolResult ReadMcpToolCallResult(const std::string& result, const std::string& server);

class McpClient {
 public:
  // Starts the server in `sandbox` and runs initialize + tools/list.
  static StatusOr<std::unique_ptr<McpClient>> Start(Sandbox& sandbox,
                                                    const McpServerOptions& options,
                                                    Deadline deadline);
  const std::vector<ToolSpec>& tools() const { return tools_; }
  const std::string& server_name() const { return server_name_; }  // from serverInfo
  bool HasTool(const std::string& name) const;
  // Validates the arguments against the tool's schema, then tools/call. Model mistakes and tool
  // errors are error ToolResults; a Status error means the server failed.
  StatusOr<ToolResult> CallTool(const ToolCall& call, Deadline deadline);

 private:
  McpClient(std::unique_ptr<JsonRpcChannel> channel, McpServerOptions options)
      : channel_(std::move(channel)), options_(std::move(options)) {}
  std::unique_ptr<JsonRpcChannel> channel_;
  McpServerOptions options_;
  std::vector<ToolSpec> tools_;
  std::string server_name_;
};

}  // namespace orrery::env
