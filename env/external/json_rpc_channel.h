// JSON-RPC 2.0 over JSON lines on a sandboxed process's stdin/stdout.
//
// The transport of both plug-in kinds that run as processes: any-language environments (the
// orrery-env/1 protocol, docs/env-protocol.md) and MCP servers (stdio transport). One request is
// in flight at a time; lines from the server that are not its response (notifications, requests
// Orrery does not serve, stray output) are skipped. A request from the server while a call waits
// (one with a "method" and an "id") goes to the request handler, when one is set, and its answer
// is written back before the call goes on waiting (orrery-env/1's run_isolated, MCP's ping and
// roots/list); a notification (a "method" without an "id") goes to the notification handler, when
// one is set. Every call has a deadline: on expiry the call fails with DeadlineExceeded and, by
// default, the channel is closed (the process is killed): an orrery-env/1 program serves one
// request at a time, so it would still be busy with the late one. An MCP server may be kept
// (OnDeadline::kKeepOpen): a late reply carries the old id and is skipped, and the client tells
// the server to cancel (notifications/cancelled).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/status.h"
#include "env/env.h"
#include "env/sandbox/sandbox.h"

namespace orrery::env {

// Reads one line the server wrote while call `id` waits: nullopt when the line is not that call's
// response (a notification, a request, stray output, a late reply; the channel skips it), else
// the response's "result" as JSON text or FailedPrecondition("<where> failed: <message>") for an
// error response. `where` is "<peer>: <method>". Never throws, whatever the bytes.
std::optional<StatusOr<std::string>> ReadJsonRpcResponse(const std::string& line, int64_t id,
                                                         const std::string& where);

// Serves a request the server sent while a call waits: its result as JSON text, or an error the
// server reads as a JSON-RPC error (NotFound: -32601 method not found; InvalidArgument: -32602
// invalid params; others -32000). `deadline` is the waiting call's.
using JsonRpcRequestHandler = std::function<StatusOr<std::string>(
    const std::string& method, const std::string& params_json, Deadline deadline)>;
// Observes a notification the server sent while a call waits.
using JsonRpcNotificationHandler =
    std::function<void(const std::string& method, const std::string& params_json)>;

// The quote of a server's stderr in an error message, at most `max_bytes`: the first line that
// reads as an error (node's "Error: Cannot find module ..." comes before a long stack, Python's
// "ModuleNotFoundError: ..." after one) and as much of the end as fits, newlines as " | ".
std::string StderrExcerpt(const std::string& stderr_text, size_t max_bytes = 400);

class JsonRpcChannel {
 public:
  enum class OnDeadline { kClose, kKeepOpen };
  // `peer` names the server in error messages ("environment 'guess'", "MCP server 'fs'").
  JsonRpcChannel(std::unique_ptr<SandboxProcess> process, std::string peer,
                 OnDeadline on_deadline = OnDeadline::kClose);
  ~JsonRpcChannel();

  // Sends {"jsonrpc":"2.0","id":N,"method":...,"params":...} and returns the response's "result"
  // as JSON text. A JSON-RPC error response becomes FailedPrecondition("<peer>: <message>").
  StatusOr<std::string> Call(const std::string& method, const std::string& params_json,
                             Deadline deadline);
  // Sends a notification (no id, no response).
  Status Notify(const std::string& method, const std::string& params_json, Deadline deadline);
  // Serves the server's requests from now on (none by default: they are skipped).
  void set_request_handler(JsonRpcRequestHandler handler) { handler_ = std::move(handler); }
  // Observes the server's notifications from now on (none by default: they are skipped).
  void set_notification_handler(JsonRpcNotificationHandler handler) {
    notification_handler_ = std::move(handler);
  }
  // Kills the process (idempotent).
  void Close();
  bool open() const { return process_ != nullptr; }
  // The id of the latest Call's request (for a cancellation).
  int64_t last_id() const { return next_id_ - 1; }

 private:
  // Answers `line` when it is a request and a handler is set, or passes it to the notification
  // handler when it is a notification; false when it is neither or there is no handler.
  StatusOr<bool> MaybeServeRequest(const std::string& line, Deadline deadline);
  // `failure` with the peer, and the quoted stderr when there is any.
  Status WithStderr(const Status& failure, const std::string& what) const;

  std::unique_ptr<SandboxProcess> process_;
  std::string peer_;
  OnDeadline on_deadline_;
  JsonRpcRequestHandler handler_;
  JsonRpcNotificationHandler notification_handler_;
  int64_t next_id_ = 1;
};

}  // namespace orrery::env
