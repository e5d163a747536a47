#include "core/chat.h"

#include <nlohmann/json.hpp>

#include "core/json_text.h"

namespace orrery {
namespace {

nlohmann::json ToJson(const ChatMessage& m) {
  nlohmann::json j;
  j["role"] = std::string(ChatRoleName(m.role));
  j["content"] = m.content;
  if (!m.tool_calls.empty()) {
    j["tool_calls"] = nlohmann::json::array();
    for (const ToolCall& c : m.tool_calls) {
      nlohmann::json args = nlohmann::json::parse(c.arguments_json, nullptr, false);
      if (args.is_discarded()) args = c.arguments_json;  // keep malformed arguments as text
      j["tool_calls"].push_back({{"id", c.id}, {"name", c.name}, {"arguments", args}});
    }
  }
  if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
  if (!m.name.empty()) j["name"] = m.name;
  return j;
}

StatusOr<ChatMessage> FromJson(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("role") || !j["role"].is_string()) {
    return InvalidArgumentError("chat message needs a string 'role'");
  }
  ChatMessage m;
  ORRERY_ASSIGN_OR_RETURN(m.role, ParseChatRole(j["role"].get<std::string>()));
  if (j.contains("content")) {
    if (!j["content"].is_string())
      return InvalidArgumentError("chat message 'content' must be a string");
    m.content = j["content"].get<std::string>();
  }
  if (j.contains("tool_calls")) {
    if (!j["tool_calls"].is_array()) return InvalidArgumentError("'tool_calls' must be an array");
    for (const auto& c : j["tool_calls"]) {
      if (!c.is_object() || !c.contains("name") || !c["name"].is_string()) {
        return InvalidArgumentError("a tool call needs a string 'name'");
      }
      ToolCall call;
      call.name = c["name"].get<std::string>();
      if (c.contains("id") && c["id"].is_string()) call.id = c["id"].get<std::string>();
      if (c.contains("arguments")) {
        call.arguments_json =
            c["arguments"].is_string() ? c["arguments"].get<std::string>() : c["arguments"].dump();
      } else {
        call.arguments_json = "{}";
      }
      m.tool_calls.push_back(std::move(call));
    }
  }
  if (j.contains("tool_call_id") && j["tool_call_id"].is_string()) {
    m.tool_call_id = j["tool_call_id"].get<std::string>();
  }
  if (j.contains("name") && j["name"].is_string()) m.name = j["name"].get<std::string>();
  return m;
}

}  // namespace

std::string_view ChatRoleName(ChatRole role) {
  switch (role) {
    case ChatRole::kSystem:
      return "system";
    case ChatRole::kUser:
      return "user";
    case ChatRole::kAssistant:
      return "assistant";
    case ChatRole::kTool:
      return "tool";
  }
  return "user";
}

StatusOr<ChatRole> ParseChatRole(std::string_view name) {
  if (name == "system") return ChatRole::kSystem;
  if (name == "user") return ChatRole::kUser;
  if (name == "assistant") return ChatRole::kAssistant;
  if (name == "tool") return ChatRole::kTool;
  return InvalidArgumentError("unknown chat role '" + std::string(name) +
                              "' (expected system, user, assistant or tool)");
}

// Model text may hold invalid UTF-8: it is replaced (U+FFFD), never a throw.
std::string ChatMessageToJson(const ChatMessage& message) { return JsonText(ToJson(message)); }

StatusOr<ChatMessage> ChatMessageFromJson(const std::string& json) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded()) return InvalidArgumentError("chat message is not valid JSON");
  return FromJson(j);
}

std::string ChatMessagesToJson(const std::vector<ChatMessage>& messages) {
  nlohmann::json arr = nlohmann::json::array();
  for (const ChatMessage& m : messages) arr.push_back(ToJson(m));
  return JsonText(arr);
}

StatusOr<std::vector<ChatMessage>> ChatMessagesFromJson(const std::string& json) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_array())
    return InvalidArgumentError("chat messages must be a JSON array");
  std::vector<ChatMessage> out;
  for (const auto& e : j) {
    ORRERY_ASSIGN_OR_RETURN(ChatMessage m, FromJson(e));
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace orrery
