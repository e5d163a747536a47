// The chat format: how conversations with tool calls become token ids, and how a generated
// assistant turn becomes text and tool calls again. docs/chat-format.md is the user-facing copy.
//
// Every structural marker is a special token, so no text a user or tool writes can forge one:
//
//   <|system|>You are a calculator agent.<|end|>
//   <|user|>What is 12*7?<|end|>
//   <|assistant|><|tool_call|>{"name": "calculate", "arguments": {"expression":
//   "12*7"}}<|/tool_call|><|end|>
//   <|tool|>84<|end|>
//   <|assistant|>12*7 = 84.<|end|>
//
// A turn is <|role|> content <|end|>. An assistant turn holds its text, then each tool call as a
// JSON object {"name": ..., "arguments": {...}} between <|tool_call|> and <|/tool_call|>. Tool
// results answer the calls of the preceding assistant turn in order. Plain-text documents end with
// <|endoftext|>. <|pad|> fills unused positions and is never a target.
//
// Rendering gives per-token loss mask (1 on what the assistant writes: its content, its tool-call
// markup and its closing <|end|>; 0 on role headers and on everything system, user and tool wrote)
// and a role id per token, which the trainer and the RL trajectory builder use directly.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/chat.h"
#include "core/status.h"
#include "model/tokenizer.h"

namespace orrery {

// The special tokens of the chat format, in the id order `orrery tokenizer train` gives them.
const std::vector<std::string>& ChatSpecialTokens();

// Role ids in RenderedChat::roles; kNoRole marks tokens outside any message (<|endoftext|>).
constexpr int8_t kNoRole = -1;

struct RenderedChat {
  std::vector<int32_t> ids;
  std::vector<uint8_t> loss_mask;  // 1 where the token is a training target
  std::vector<int8_t> roles;       // static_cast<int8_t>(ChatRole) or kNoRole
};

// A parsed assistant turn.
struct ParsedAssistantTurn {
  ChatMessage message;    // role assistant; content and tool_calls (ids "call_0", "call_1", ...)
  bool finished = false;  // the turn ended with <|end|> (or <|endoftext|>), not by running out
};

class ChatFormat {
 public:
  // Fails when the tokenizer lacks any of ChatSpecialTokens().
  static StatusOr<ChatFormat> Create(const Tokenizer* tokenizer);

  // Renders a whole conversation (training data). Fails on a tool call whose arguments are not a
  // JSON object.
  StatusOr<RenderedChat> Render(const std::vector<ChatMessage>& messages) const;
  // Renders the conversation so far and opens an assistant turn (<|assistant|> last): the prompt
  // the model continues. Nothing in it is a target.
  StatusOr<RenderedChat> RenderPrompt(const std::vector<ChatMessage>& messages) const;
  // A plain-text document: its tokens then <|endoftext|>, all targets, no role.
  RenderedChat RenderText(std::string_view text) const;

  // Parses generated ids that follow an assistant header, up to and including the first <|end|>
  // (later ids are ignored). Malformed markup (a tool call that is not a JSON object with a string
  // "name" and an object "arguments", an unclosed <|tool_call|>, any other special token inside the
  // turn) is an InvalidArgument error saying what was wrong: the rollout engine counts it as a
  // format failure.
  StatusOr<ParsedAssistantTurn> ParseAssistantTurn(const std::vector<int32_t>& ids) const;

  int32_t end_of_text_id() const { return eot_; }
  int32_t end_of_turn_id() const { return end_; }
  int32_t pad_id() const { return pad_; }
  int32_t role_id(ChatRole role) const { return role_ids_[static_cast<int>(role)]; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  explicit ChatFormat(const Tokenizer* tokenizer) : tokenizer_(tokenizer) {}
  Status AppendMessage(const ChatMessage& m, RenderedChat* out) const;

  const Tokenizer* tokenizer_;
  int32_t eot_ = -1, pad_ = -1, end_ = -1, call_open_ = -1, call_close_ = -1;
  int32_t role_ids_[4] = {-1, -1, -1, -1};
};

}  // namespace orrery
