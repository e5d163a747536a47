// Bounded mutation fuzzing (issue 27) of what reads model and plug-in bytes: the tool-call
// parser, the chat format, the orrery-env/1 JSON-lines replies and the MCP JSON-RPC reader. Each
// input must give a value or a Status error: no crash, no abort, no exception.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/json_text.h"
#include "env/external/external_env.h"
#include "env/external/json_rpc_channel.h"
#include "env/mcp/mcp_client.h"
#include "env/tool_call.h"
#include "model/chat_format.h"
#include "tests/unit/fuzz/fuzz_harness.h"

namespace orrery {
namespace {

using env::ToolSpec;
using fuzz::Mutator;
using fuzz::RunFuzzer;

bool IsJsonObject(const std::string& text) { return ParseUntrustedJson(text).is_object(); }

// The calculator's schema and a richer one exercising every keyword ValidateToolCall checks.
std::vector<ToolSpec> FuzzTools(Mutator& m) {
  std::vector<ToolSpec> tools = {
      {"calculate", "",
       R"({"type":"object","properties":{"expression":{"type":"string","maxLength":200}},)"
       R"("required":["expression"],"additionalProperties":false})"},
      {"search", "",
       R"({"type":"object","properties":{"q":{"type":"string"},"k":{"type":"integer",)"
       R"("minimum":1,"maximum":50},"w":{"type":"number"},"f":{"type":"boolean"},)"
       R"("tags":{"type":"array"},"o":{"type":"object"},"mode":{"enum":["a","b",1]}},)"
       R"("required":["q"]})"}};
  // Schemas come from plug-ins: sometimes a mutated one.
  if (m.Uniform(4) == 0) m.Mutate(&tools[m.Uniform(2)].parameters_json);
  return tools;
}

void CheckToolCall(Mutator& m, const std::string& input) {
  const std::vector<ToolSpec> tools = FuzzTools(m);
  ToolCall call{"call_0", m.Uniform(2) == 0 ? "calculate" : "search", input};
  if (m.Uniform(16) == 0) m.Mutate(&call.name);
  StatusOr<std::string> args = env::ValidateToolCall(call, tools);
  if (!args.ok()) {
    EXPECT_EQ(args.status().code(), StatusCode::kInvalidArgument) << args.status().ToString();
    EXPECT_FALSE(args.status().message().empty());
    EXPECT_TRUE(env::ToolError(args.status().message()).is_error);
    return;
  }
  // The validated arguments are an object that validates again to the same text.
  ASSERT_TRUE(IsJsonObject(*args)) << *args;
  call.arguments_json = *args;
  StatusOr<std::string> again = env::ValidateToolCall(call, tools);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, *args);
}

TEST(FuzzTest, ToolCallParser) { EXPECT_GT(RunFuzzer("tool_call", CheckToolCall), 0); }

class ChatFormatFuzz : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    BpeTrainer trainer;
    for (int i = 0; i < 20; ++i) {
      trainer.AddText(
          "What is 12*7? The answer is 84. {\"name\": \"calculate\", \"arguments\": "
          "{\"expression\": \"12*7\"}}");
    }
    BpeTrainOptions options;
    options.vocab_size = 350;
    options.special_tokens = ChatSpecialTokens();
    tokenizer_ = new Tokenizer(*trainer.Train(options));
    format_ = new ChatFormat(*ChatFormat::Create(tokenizer_));
  }

  // Text with the chat markers written out becomes ids with the markers as special tokens (what
  // a model can generate; Encode alone never makes a special token).
  static std::vector<int32_t> Ids(Mutator& m, const std::string& text) {
    std::vector<int32_t> ids;
    size_t at = 0;
    while (at < text.size()) {
      size_t next = std::string::npos, len = 0;
      int32_t special = -1;
      for (const std::string& t : ChatSpecialTokens()) {
        const size_t p = text.find(t, at);
        if (p < next) {
          next = p;
          len = t.size();
          special = *tokenizer_->SpecialTokenId(t);
        }
      }
      const std::vector<int32_t> plain =
          tokenizer_->Encode(std::string_view(text).substr(at, next - at));
      ids.insert(ids.end(), plain.begin(), plain.end());
      if (next == std::string::npos) break;
      ids.push_back(special);
      at = next + len;
    }
    // Id-level mutations: ids outside the vocabulary, stray special tokens.
    if (!ids.empty() && m.Uniform(8) == 0) {
      const int32_t odd[] = {-1,
                             -2147483647 - 1,
                             tokenizer_->vocab_size(),
                             tokenizer_->vocab_size() + 1000,
                             format_->pad_id(),
                             format_->role_id(ChatRole::kTool),
                             2147483647};
      ids[m.Uniform(ids.size())] = odd[m.Uniform(std::size(odd))];
    }
    return ids;
  }

  static Tokenizer* tokenizer_;
  static ChatFormat* format_;
};
Tokenizer* ChatFormatFuzz::tokenizer_ = nullptr;
ChatFormat* ChatFormatFuzz::format_ = nullptr;

TEST_F(ChatFormatFuzz, ParseAndRenderAssistantTurns) {
  auto one = [](Mutator& m, const std::string& input) {
    StatusOr<ParsedAssistantTurn> turn = format_->ParseAssistantTurn(Ids(m, input));
    if (!turn.ok()) {
      EXPECT_TRUE(turn.status().code() == StatusCode::kInvalidArgument ||
                  turn.status().code() == StatusCode::kOutOfRange)
          << turn.status().ToString();
      return;
    }
    for (const ToolCall& c : turn->message.tool_calls) {
      EXPECT_FALSE(c.name.empty());
      EXPECT_TRUE(IsJsonObject(c.arguments_json)) << c.arguments_json;
    }
    // Round trip: rendering the parsed turn and parsing it again gives the same turn.
    StatusOr<RenderedChat> r = format_->Render({turn->message});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->ids.size(), r->loss_mask.size());
    ASSERT_EQ(r->ids.size(), r->roles.size());
    StatusOr<ParsedAssistantTurn> again =
        format_->ParseAssistantTurn(std::vector<int32_t>(r->ids.begin() + 1, r->ids.end()));
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_TRUE(again->finished);
    EXPECT_EQ(again->message.content, turn->message.content);
    ASSERT_EQ(again->message.tool_calls.size(), turn->message.tool_calls.size());
    for (size_t i = 0; i < again->message.tool_calls.size(); ++i) {
      EXPECT_EQ(again->message.tool_calls[i].name, turn->message.tool_calls[i].name);
      EXPECT_EQ(again->message.tool_calls[i].arguments_json,
                turn->message.tool_calls[i].arguments_json);
    }
  };
  EXPECT_GT(RunFuzzer("chat_format", one), 0);
}

TEST_F(ChatFormatFuzz, RenderAnyMessages) {
  // Messages as a plug-in or a data file may hold them: any bytes in content, names, arguments.
  auto one = [](Mutator& m, const std::string& input) {
    std::vector<ChatMessage> messages;
    const int n = 1 + static_cast<int>(m.Uniform(4));
    for (int i = 0; i < n; ++i) {
      ChatMessage msg;
      msg.role = static_cast<ChatRole>(m.Uniform(4));
      msg.content = m.Uniform(2) == 0 ? input : m.Next();
      if (msg.role == ChatRole::kAssistant && m.Uniform(2) == 0) {
        std::string name = "calculate";
        if (m.Uniform(4) == 0) m.Mutate(&name);
        const uint64_t pick = m.Uniform(3);
        msg.tool_calls.push_back({"call_0", name,
                                  pick == 0   ? input
                                  : pick == 1 ? m.Next()
                                              : R"({"x":[1,"y"]})"});
      }
      messages.push_back(std::move(msg));
    }
    StatusOr<RenderedChat> r =
        m.Uniform(2) == 0 ? format_->Render(messages) : format_->RenderPrompt(messages);
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
      return;
    }
    EXPECT_EQ(r->ids.size(), r->loss_mask.size());
    EXPECT_EQ(r->ids.size(), r->roles.size());
    EXPECT_TRUE(tokenizer_->Decode(r->ids).ok());
    const RenderedChat t = format_->RenderText(input);
    EXPECT_EQ(t.ids.back(), format_->end_of_text_id());
  };
  EXPECT_GT(RunFuzzer("chat_format", one), 0);
}

// The second crash the fuzzer found: a tool call whose name is not UTF-8 threw type_error 316
// out of Render (nlohmann's dump); the name's invalid bytes now render as U+FFFD.
TEST_F(ChatFormatFuzz, ToolCallNameThatIsNotUtf8Renders) {
  ChatMessage m{ChatRole::kAssistant, "", {{"call_0", "calc\xa6", R"({"x":1})"}}, "", ""};
  StatusOr<RenderedChat> r = format_->Render({m});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NE(tokenizer_->Decode(r->ids)->find("calc\xef\xbf\xbd"), std::string::npos);
}

// Every reply reader of orrery-env/1, fed both through the JSON-RPC line reader and directly.
void CheckExternalResult(const std::string& result) {
  const std::string peer = "environment 'fuzz'";
  auto check = [](const Status& s) {
    if (!s.ok()) {
      EXPECT_FALSE(s.message().empty());
    }
  };
  StatusOr<std::string> name = env::ReadDescribeResult(result, peer);
  if (!name.ok()) {
    EXPECT_EQ(name.status().code(), StatusCode::kFailedPrecondition);
  }
  StatusOr<env::ExternalResetResult> reset = env::ReadResetResult(result, peer);
  check(reset.status());
  if (reset.ok()) {
    for (const ToolSpec& t : reset->tools) {
      EXPECT_FALSE(ParseUntrustedJson(t.parameters_json).is_discarded());
    }
  }
  StatusOr<env::ToolResult> step = env::ReadStepResult(result);
  if (!step.ok()) {
    EXPECT_EQ(step.status().code(), StatusCode::kFailedPrecondition);
  }
  StatusOr<env::EpisodeScore> score = env::ReadScoreResult(result);
  if (!score.ok()) {
    EXPECT_EQ(score.status().code(), StatusCode::kFailedPrecondition);
  }
}

// The JSON-RPC line reader: skipped, a result that is JSON text, or a FailedPrecondition.
std::optional<std::string> CheckResponseLine(const std::string& line) {
  std::optional<StatusOr<std::string>> r = env::ReadJsonRpcResponse(line, 1, "peer: step");
  if (!r) return std::nullopt;
  if (!r->ok()) {
    EXPECT_EQ(r->status().code(), StatusCode::kFailedPrecondition) << r->status().ToString();
    return std::nullopt;
  }
  EXPECT_FALSE(ParseUntrustedJson(**r).is_discarded()) << **r;
  return **r;
}

TEST(FuzzTest, ExternalEnvJsonLines) {
  auto one = [](Mutator& m, const std::string& input) {
    if (std::optional<std::string> result = CheckResponseLine(input)) CheckExternalResult(*result);
    if (m.Uniform(2) == 0) CheckExternalResult(input);
  };
  EXPECT_GT(RunFuzzer("external_env", one), 0);
}

TEST(FuzzTest, McpJsonRpcReader) {
  auto one = [](Mutator& m, const std::string& input) {
    std::optional<std::string> result = CheckResponseLine(input);
    const std::string& text = result ? *result : input;
    (void)env::ReadMcpServerName(text);
    StatusOr<env::McpToolsPage> page = env::ReadMcpToolsList(text, "fuzz");
    if (!page.ok()) {
      EXPECT_EQ(page.status().code(), StatusCode::kFailedPrecondition);
    } else if (!page->tools.empty()) {
      // A server's schema then checks a call, as McpClient::CallTool does.
      ToolCall call{"call_0", page->tools[m.Uniform(page->tools.size())].name,
                    m.Uniform(2) == 0 ? "{}" : m.Next()};
      StatusOr<std::string> args = env::ValidateToolCall(call, page->tools);
      if (args.ok()) {
        EXPECT_TRUE(IsJsonObject(*args));
      }
    }
    const env::ToolResult call = env::ReadMcpToolCallResult(text, "fuzz");
    EXPECT_EQ(call.latency_s, 0);
  };
  EXPECT_GT(RunFuzzer("mcp", one), 0);
}

// The crash the fuzzer found: JSON nested 100000 deep passed nlohmann's (iterative) parser, then
// overflowed the stack in the recursive copy/dump/destructor. Now it is invalid JSON everywhere.
TEST(FuzzTest, DeepNestingIsRejectedNotACrash) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  EXPECT_TRUE(ParseUntrustedJson(deep).is_discarded());
  EXPECT_FALSE(env::ReadJsonRpcResponse(R"({"jsonrpc":"2.0","id":1,"result":)" + deep + "}", 1,
                                        "peer: step"));
  EXPECT_FALSE(env::ValidateToolCall({"c", "f", R"({"a":)" + deep + "}"}, {{"f", "", "{}"}}).ok());
  EXPECT_FALSE(env::ReadStepResult(R"({"content":"x","more":)" + deep + "}").ok());
  EXPECT_FALSE(env::ReadMcpToolsList(R"({"tools":)" + deep + "}", "fuzz").ok());
  // Strings are not counted, and depth kMaxJsonDepth is still accepted.
  EXPECT_TRUE(JsonDepthWithin("\"" + std::string(1000, '[') + "\""));
  const std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_FALSE(ParseUntrustedJson(ok).is_discarded());
  EXPECT_TRUE(ParseUntrustedJson("[" + ok + "]").is_discarded());
}

}  // namespace
}  // namespace orrery
