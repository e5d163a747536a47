#include "env/external/json_rpc_channel.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/json_text.h"

namespace orrery::env {

using nlohmann::json;

std::optional<StatusOr<std::string>> ReadJsonRpcResponse(const std::string& line, int64_t id,
                                                         const std::string& where) {
  json reply = ParseUntrustedJson(line);
  if (reply.is_discarded() || !reply.is_object() || !reply.contains("id") ||
      reply.contains("method")) {
    return std::nullopt;  // a notification, a server-to-client request or stray output
  }
  if (reply["id"] != id) return std::nullopt;  // a late reply to an earlier call
  if (reply.contains("error")) {
    const json& e = reply["error"];
    const std::string message = e.is_object() && e.contains("message") && e["message"].is_string()
                                    ? e["message"].get<std::string>()
                                    : e.dump();
    return FailedPreconditionError(where + " failed: " + message);
  }
  if (!reply.contains("result")) {
    return FailedPreconditionError(where + ": response without a result");
  }
  return reply["result"].dump();
}

namespace {

bool LooksLikeAnError(const std::string& line) {
  static const char* const kWords[] = {"Error",  "error:", "Exception", "Cannot",
                                       "cannot", "FATAL",  "fatal",     "panic"};
  for (const char* w : kWords) {
    if (line.find(w) != std::string::npos) return true;
  }
  return false;
}

// Lines joined with " | ", empty ones dropped.
std::string OneLine(const std::string& text) {
  std::string out;
  bool pending = false;
  for (char c : text) {
    if (c == '\n' || c == '\r') {
      pending = !out.empty();
      continue;
    }
    if (pending) out += " | ";
    pending = false;
    out += c;
  }
  return out;
}

}  // namespace

std::string StderrExcerpt(const std::string& stderr_text, size_t max_bytes) {
  const std::string all = OneLine(stderr_text);
  if (all.size() <= max_bytes) return all;
  std::string first;  // the first line that reads as an error
  size_t start = 0;
  while (start < stderr_text.size()) {
    size_t end = stderr_text.find('\n', start);
    if (end == std::string::npos) end = stderr_text.size();
    const std::string line = stderr_text.substr(start, end - start);
    if (LooksLikeAnError(line)) {
      first = OneLine(line).substr(0, max_bytes / 2);
      break;
    }
    start = end + 1;
  }
  const std::string sep = " ... ";
  const size_t tail = max_bytes - std::min(max_bytes, first.size() + sep.size());
  std::string end_part = all.substr(all.size() - std::min(all.size(), tail));
  return first.empty() ? "..." + end_part : first + sep + end_part;
}

JsonRpcChannel::JsonRpcChannel(std::unique_ptr<SandboxProcess> process, std::string peer,
                               OnDeadline on_deadline)
    : process_(std::move(process)), peer_(std::move(peer)), on_deadline_(on_deadline) {}

Status JsonRpcChannel::WithStderr(const Status& failure, const std::string& what) const {
  const std::string err = process_ ? StderrExcerpt(process_->stderr_text()) : "";
  return Status(failure.code(), peer_ + ": " + what + failure.message() +
                                    (err.empty() ? "" : " (stderr: " + err + ")"));
}

StatusOr<bool> JsonRpcChannel::MaybeServeRequest(const std::string& line, Deadline deadline) {
  if (!handler_ && !notification_handler_) return false;
  const json request = ParseUntrustedJson(line);
  if (request.is_discarded() || !request.is_object() || !request.contains("method") ||
      !request["method"].is_string()) {
    return false;
  }
  const json params = request.contains("params") ? request["params"] : json::object();
  if (!request.contains("id")) {
    if (!notification_handler_) return false;
    notification_handler_(request["method"].get<std::string>(), JsonText(params));
    return true;
  }
  if (!handler_) return false;
  StatusOr<std::string> result =
      handler_(request["method"].get<std::string>(), JsonText(params), deadline);
  json response = {{"jsonrpc", "2.0"}, {"id", request["id"]}};
  if (result.ok()) {
    response["result"] = json::parse(*result, nullptr, false);
  } else {
    const int code = result.status().code() == StatusCode::kNotFound          ? -32601
                     : result.status().code() == StatusCode::kInvalidArgument ? -32602
                                                                              : -32000;
    response["error"] = {{"code", code}, {"message", result.status().message()}};
  }
  ORRERY_RETURN_IF_ERROR(process_->WriteLine(JsonText(response), deadline));
  return true;
}

JsonRpcChannel::~JsonRpcChannel() { Close(); }

void JsonRpcChannel::Close() { process_.reset(); }

Status JsonRpcChannel::Notify(const std::string& method, const std::string& params_json,
                              Deadline deadline) {
  if (!process_) return UnavailableError(peer_ + ": closed");
  json msg = {{"jsonrpc", "2.0"}, {"method", method}};
  if (!params_json.empty()) msg["params"] = json::parse(params_json, nullptr, false);
  return process_->WriteLine(JsonText(msg), deadline).WithContext(peer_);
}

StatusOr<std::string> JsonRpcChannel::Call(const std::string& method,
                                           const std::string& params_json, Deadline deadline) {
  if (!process_) return UnavailableError(peer_ + ": closed after an earlier failure");
  const int64_t id = next_id_++;
  json msg = {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}};
  json params = json::parse(params_json.empty() ? "{}" : params_json, nullptr, false);
  if (params.is_discarded()) return InternalError("JsonRpcChannel: params are not JSON");
  msg["params"] = params;
  Status sent = process_->WriteLine(JsonText(msg), deadline);
  if (!sent.ok()) {
    Status failure = WithStderr(sent, "");
    Close();
    return failure;
  }
  for (;;) {
    StatusOr<std::string> line = process_->ReadLine(deadline);
    if (!line.ok()) {
      Status failure = WithStderr(line.status(), method + ": ");
      const bool keep = on_deadline_ == OnDeadline::kKeepOpen &&
                        line.status().code() == StatusCode::kDeadlineExceeded &&
                        process_->running();
      if (!keep) Close();
      return failure;
    }
    std::optional<StatusOr<std::string>> response =
        ReadJsonRpcResponse(*line, id, peer_ + ": " + method);
    if (response) return *std::move(response);
    StatusOr<bool> served = MaybeServeRequest(*line, deadline);
    if (!served.ok()) {
      Close();
      return Status(served.status().code(), peer_ + ": " + method + ": answering its request: " +
                                                served.status().message());
    }
  }
}

}  // namespace orrery::env
