#include "actors/envserver/codec.h"

namespace orrery::envserver {

void ToWire(const ToolCall& call, schema::EnvToolCall::Builder out) {
  out.setId(call.id);
  out.setName(call.name);
  out.setArgumentsJson(call.arguments_json);
}

ToolCall FromWire(schema::EnvToolCall::Reader in) {
  return ToolCall{in.getId().cStr(), in.getName().cStr(), in.getArgumentsJson().cStr()};
}

void ToWire(const env::ToolSpec& spec, schema::EnvToolSpec::Builder out) {
  out.setName(spec.name);
  out.setDescription(spec.description);
  out.setParametersJson(spec.parameters_json);
}

env::ToolSpec FromWire(schema::EnvToolSpec::Reader in) {
  return env::ToolSpec{in.getName().cStr(), in.getDescription().cStr(),
                       in.getParametersJson().cStr()};
}

void ToWire(const ChatMessage& message, schema::EnvChatMessage::Builder out) {
  out.setRole(std::string(ChatRoleName(message.role)));
  out.setContent(message.content);
  auto calls = out.initToolCalls(static_cast<unsigned>(message.tool_calls.size()));
  for (size_t i = 0; i < message.tool_calls.size(); ++i) {
    ToWire(message.tool_calls[i], calls[static_cast<unsigned>(i)]);
  }
  out.setToolCallId(message.tool_call_id);
  out.setName(message.name);
}

StatusOr<ChatMessage> FromWire(schema::EnvChatMessage::Reader in) {
  ChatMessage m;
  ORRERY_ASSIGN_OR_RETURN(m.role, ParseChatRole(in.getRole().cStr()));
  m.content = in.getContent().cStr();
  for (auto call : in.getToolCalls()) m.tool_calls.push_back(FromWire(call));
  m.tool_call_id = in.getToolCallId().cStr();
  m.name = in.getName().cStr();
  return m;
}

void MessagesToWire(const std::vector<ChatMessage>& messages,
                    capnp::List<schema::EnvChatMessage>::Builder out) {
  for (size_t i = 0; i < messages.size(); ++i) ToWire(messages[i], out[static_cast<unsigned>(i)]);
}

StatusOr<std::vector<ChatMessage>> MessagesFromWire(
    capnp::List<schema::EnvChatMessage>::Reader in) {
  std::vector<ChatMessage> out;
  out.reserve(in.size());
  for (unsigned i = 0; i < in.size(); ++i) {
    StatusOr<ChatMessage> m = FromWire(in[i]);
    if (!m.ok()) return m.status().WithContext("message " + std::to_string(i));
    out.push_back(std::move(m).value());
  }
  return out;
}

uint64_t EpisodeIncarnation(const std::string& episode_id) {
  if (episode_id.size() < 18 || episode_id[16] != '-') return 0;
  uint64_t v = 0;
  for (int i = 0; i < 16; ++i) {
    const char c = episode_id[i];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return 0;
    }
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

}  // namespace orrery::envserver
