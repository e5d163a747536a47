#include "env/external/json_rpc_channel.h"

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

StatusOr<bool> JsonRpcChannel::MaybeServeRequest(const std::string& line, Deadline deadline) {
  if (!handler_) return false;
  const json request = ParseUntrustedJson(line);
  if (request.is_discarded() || !request.is_object() || !request.contains("id") ||
      !request.contains("method") || !request["method"].is_string()) {
    return false;
  }
  const json params = request.contains("params") ? request["params"] : json::object();
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

JsonRpcChannel::JsonRpcChannel(std::unique_ptr<SandboxProcess> process, std::string peer)
    : process_(std::move(process)), peer_(std::move(peer)) {}

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
    const std::string err = process_->stderr_text();
    Close();
    return Status(sent.code(), peer_ + ": " + sent.message() +
                                   (err.empty() ? "" : " (stderr: " + err.substr(0, 300) + ")"));
  }
  for (;;) {
    StatusOr<std::string> line = process_->ReadLine(deadline);
    if (!line.ok()) {
      std::string err = process_->stderr_text();
      if (err.size() > 300) err = err.substr(err.size() - 300);
      Close();
      return Status(line.status().code(), peer_ + ": " + method + ": " + line.status().message() +
                                              (err.empty() ? "" : " (stderr: " + err + ")"));
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
