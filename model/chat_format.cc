#include "model/chat_format.h"

#include <nlohmann/json.hpp>

#include "core/json_text.h"

namespace orrery {
namespace {

constexpr const char* kEndOfText = "<|endoftext|>";
constexpr const char* kPad = "<|pad|>";
constexpr const char* kEnd = "<|end|>";
constexpr const char* kToolCallOpen = "<|tool_call|>";
constexpr const char* kToolCallClose = "<|/tool_call|>";
constexpr const char* kRoleTokens[4] = {"<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"};

void Append(RenderedChat* out, const std::vector<int32_t>& ids, uint8_t target, int8_t role) {
  out->ids.insert(out->ids.end(), ids.begin(), ids.end());
  out->loss_mask.insert(out->loss_mask.end(), ids.size(), target);
  out->roles.insert(out->roles.end(), ids.size(), role);
}

void AppendOne(RenderedChat* out, int32_t id, uint8_t target, int8_t role) {
  out->ids.push_back(id);
  out->loss_mask.push_back(target);
  out->roles.push_back(role);
}

}  // namespace

const std::vector<std::string>& ChatSpecialTokens() {
  static const std::vector<std::string>* tokens = new std::vector<std::string>{
      kEndOfText,     kPad, kRoleTokens[0], kRoleTokens[1], kRoleTokens[2],
      kRoleTokens[3], kEnd, kToolCallOpen,  kToolCallClose};
  return *tokens;
}

StatusOr<ChatFormat> ChatFormat::Create(const Tokenizer* tokenizer) {
  ChatFormat f(tokenizer);
  auto need = [&](const char* content, int32_t* id) -> Status {
    std::optional<int32_t> v = tokenizer->SpecialTokenId(content);
    if (!v) {
      return InvalidArgumentError(std::string("tokenizer lacks the chat special token ") + content +
                                  " (train it with `orrery tokenizer train`)");
    }
    *id = *v;
    return Status::OK();
  };
  ORRERY_RETURN_IF_ERROR(need(kEndOfText, &f.eot_));
  ORRERY_RETURN_IF_ERROR(need(kPad, &f.pad_));
  ORRERY_RETURN_IF_ERROR(need(kEnd, &f.end_));
  ORRERY_RETURN_IF_ERROR(need(kToolCallOpen, &f.call_open_));
  ORRERY_RETURN_IF_ERROR(need(kToolCallClose, &f.call_close_));
  for (int r = 0; r < 4; ++r) ORRERY_RETURN_IF_ERROR(need(kRoleTokens[r], &f.role_ids_[r]));
  return f;
}

Status ChatFormat::AppendMessage(const ChatMessage& m, RenderedChat* out) const {
  const int8_t role = static_cast<int8_t>(m.role);
  const uint8_t target = m.role == ChatRole::kAssistant ? 1 : 0;
  AppendOne(out, role_ids_[static_cast<int>(m.role)], 0, role);
  Append(out, tokenizer_->Encode(m.content), target, role);
  for (const ToolCall& call : m.tool_calls) {
    nlohmann::json args = ParseUntrustedJson(call.arguments_json);
    if (args.is_discarded() || !args.is_object()) {
      return InvalidArgumentError("tool call '" + call.name +
                                  "': arguments are not a JSON object: " + call.arguments_json);
    }
    nlohmann::ordered_json body = {{"name", call.name}, {"arguments", args}};
    AppendOne(out, call_open_, target, role);
    // The name may hold any bytes (a plug-in's messages, a data file): dump() would throw on
    // invalid UTF-8, so each such byte becomes U+FFFD.
    const std::string text =
        body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    Append(out, tokenizer_->Encode(text), target, role);
    AppendOne(out, call_close_, target, role);
  }
  AppendOne(out, end_, target, role);
  return Status::OK();
}

StatusOr<RenderedChat> ChatFormat::Render(const std::vector<ChatMessage>& messages) const {
  RenderedChat out;
  for (const ChatMessage& m : messages) ORRERY_RETURN_IF_ERROR(AppendMessage(m, &out));
  return out;
}

StatusOr<RenderedChat> ChatFormat::RenderPrompt(const std::vector<ChatMessage>& messages) const {
  ORRERY_ASSIGN_OR_RETURN(RenderedChat out, Render(messages));
  AppendOne(&out, role_ids_[static_cast<int>(ChatRole::kAssistant)], 0,
            static_cast<int8_t>(ChatRole::kAssistant));
  std::fill(out.loss_mask.begin(), out.loss_mask.end(), 0);
  return out;
}

RenderedChat ChatFormat::RenderText(std::string_view text) const {
  RenderedChat out;
  Append(&out, tokenizer_->Encode(text), 1, kNoRole);
  AppendOne(&out, eot_, 1, kNoRole);
  return out;
}

StatusOr<ParsedAssistantTurn> ChatFormat::ParseAssistantTurn(
    const std::vector<int32_t>& ids) const {
  ParsedAssistantTurn turn;
  turn.message.role = ChatRole::kAssistant;
  std::vector<int32_t> text, call;
  bool in_call = false;
  auto decode = [&](const std::vector<int32_t>& span) -> StatusOr<std::string> {
    return tokenizer_->Decode(span);
  };
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id == end_ || id == eot_) {
      turn.finished = true;
      break;
    }
    if (id == call_open_) {
      if (in_call)
        return InvalidArgumentError("nested <|tool_call|> at token " + std::to_string(i));
      in_call = true;
      call.clear();
      continue;
    }
    if (id == call_close_) {
      if (!in_call) {
        return InvalidArgumentError("<|/tool_call|> without <|tool_call|> at token " +
                                    std::to_string(i));
      }
      in_call = false;
      ORRERY_ASSIGN_OR_RETURN(std::string body, decode(call));
      nlohmann::json j = ParseUntrustedJson(body);
      if (j.is_discarded() || !j.is_object()) {
        return InvalidArgumentError("tool call is not a JSON object: " + body);
      }
      if (!j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty()) {
        return InvalidArgumentError("tool call lacks a string \"name\": " + body);
      }
      if (!j.contains("arguments") || !j["arguments"].is_object()) {
        return InvalidArgumentError("tool call \"arguments\" is not a JSON object: " + body);
      }
      ToolCall tc;
      tc.id = "call_" + std::to_string(turn.message.tool_calls.size());
      tc.name = j["name"].get<std::string>();
      tc.arguments_json = j["arguments"].dump();
      turn.message.tool_calls.push_back(std::move(tc));
      continue;
    }
    if (tokenizer_->IsSpecial(id)) {
      return InvalidArgumentError("unexpected special token " +
                                  std::string(tokenizer_->TokenBytes(id)) + " at token " +
                                  std::to_string(i) + " of an assistant turn");
    }
    if (id < 0 || id >= tokenizer_->vocab_size()) {
      return OutOfRangeError("token id " + std::to_string(id) + " is outside the vocabulary");
    }
    (in_call ? call : text).push_back(id);
  }
  if (in_call) return InvalidArgumentError("unclosed <|tool_call|>");
  ORRERY_ASSIGN_OR_RETURN(turn.message.content, decode(text));
  return turn;
}

}  // namespace orrery
