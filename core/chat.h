// Chat messages and tool calls: the vocabulary shared by environments (which produce and consume
// them), the chat format (which turns them into tokens) and the rollout agent loop.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace orrery {

enum class ChatRole { kSystem, kUser, kAssistant, kTool };

std::string_view ChatRoleName(ChatRole role);  // "system", "user", "assistant", "tool"
StatusOr<ChatRole> ParseChatRole(std::string_view name);

struct ToolCall {
  std::string id;              // unique within an episode ("call_0")
  std::string name;            // the tool's name ("calculate")
  std::string arguments_json;  // a JSON object, as text
};

struct ChatMessage {
  ChatRole role = ChatRole::kUser;
  std::string content;
  std::vector<ToolCall> tool_calls;  // assistant messages only
  std::string tool_call_id;          // tool messages: the call answered
  std::string name;                  // tool messages: the tool's name
};

// JSON: {"role": "...", "content": "...", "tool_calls": [{"id","name","arguments"}],
//        "tool_call_id": "...", "name": "..."} (empty fields omitted). `arguments` is the JSON
// object itself, not a string.
std::string ChatMessageToJson(const ChatMessage& message);
StatusOr<ChatMessage> ChatMessageFromJson(const std::string& json);
std::string ChatMessagesToJson(const std::vector<ChatMessage>& messages);  // a JSON array
StatusOr<std::vector<ChatMessage>> ChatMessagesFromJson(const std::string& json);

}  // namespace orrery
