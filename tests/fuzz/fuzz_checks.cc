#include "tests/fuzz/fuzz_checks.h"

#include <memory>
#include <optional>
#include <vector>

#include "core/json_text.h"
#include "env/calc/expression.h"
#include "env/calc/one_operation.h"
#include "env/external/external_env.h"
#include "env/external/json_rpc_channel.h"
#include "env/external/run_isolated.h"
#include "env/mcp/mcp_client.h"
#include "env/tool_call.h"
#include "model/chat_format.h"

namespace orrery::fuzz {
namespace {

using env::ToolSpec;

// Returns the message when a property does not hold.
#define FUZZ_REQUIRE(cond, what)           \
  do {                                     \
    if (!(cond)) return std::string(what); \
  } while (false)

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

// A tokenizer and chat format trained once on a few calculator turns.
struct Chat {
  Chat() {
    BpeTrainer trainer;
    for (int i = 0; i < 20; ++i) {
      trainer.AddText(
          "What is 12*7? The answer is 84. {\"name\": \"calculate\", \"arguments\": "
          "{\"expression\": \"12*7\"}}");
    }
    BpeTrainOptions options;
    options.vocab_size = 350;
    options.special_tokens = ChatSpecialTokens();
    tokenizer = std::make_unique<Tokenizer>(*trainer.Train(options));
    format = std::make_unique<ChatFormat>(*ChatFormat::Create(tokenizer.get()));
  }
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatFormat> format;
};

const Chat& TheChat() {
  static const Chat* chat = new Chat();
  return *chat;
}

// Text with the chat markers written out becomes ids with the markers as special tokens (what a
// model can generate; Encode alone never makes a special token).
std::vector<int32_t> Ids(Mutator& m, const std::string& text) {
  const Chat& chat = TheChat();
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
        special = *chat.tokenizer->SpecialTokenId(t);
      }
    }
    const std::vector<int32_t> plain =
        chat.tokenizer->Encode(std::string_view(text).substr(at, next - at));
    ids.insert(ids.end(), plain.begin(), plain.end());
    if (next == std::string::npos) break;
    ids.push_back(special);
    at = next + len;
  }
  // Id-level mutations: ids outside the vocabulary, stray special tokens.
  if (!ids.empty() && m.Uniform(8) == 0) {
    const int32_t odd[] = {-1,
                           -2147483647 - 1,
                           chat.tokenizer->vocab_size(),
                           chat.tokenizer->vocab_size() + 1000,
                           chat.format->pad_id(),
                           chat.format->role_id(ChatRole::kTool),
                           2147483647};
    ids[m.Uniform(ids.size())] = odd[m.Uniform(std::size(odd))];
  }
  return ids;
}

std::string CheckExternalResult(const std::string& result) {
  const std::string peer = "environment 'fuzz'";
  StatusOr<std::string> name = env::ReadDescribeResult(result, peer);
  FUZZ_REQUIRE(name.ok() || name.status().code() == StatusCode::kFailedPrecondition,
               "describe: " + name.status().ToString());
  StatusOr<env::ExternalResetResult> reset = env::ReadResetResult(result, peer);
  FUZZ_REQUIRE(reset.ok() || !reset.status().message().empty(), "reset: an empty error");
  if (reset.ok()) {
    for (const ToolSpec& t : reset->tools) {
      FUZZ_REQUIRE(!ParseUntrustedJson(t.parameters_json).is_discarded(),
                   "reset: a tool schema that does not parse: " + t.parameters_json);
    }
  }
  StatusOr<env::ToolResult> step = env::ReadStepResult(result);
  FUZZ_REQUIRE(step.ok() || step.status().code() == StatusCode::kFailedPrecondition,
               "step: " + step.status().ToString());
  StatusOr<env::EpisodeScore> score = env::ReadScoreResult(result);
  FUZZ_REQUIRE(score.ok() || score.status().code() == StatusCode::kFailedPrecondition,
               "score: " + score.status().ToString());
  // The same text as the params of a program's run_isolated request.
  StatusOr<env::RunIsolatedRequest> run = env::ReadRunIsolatedParams(result, 30);
  FUZZ_REQUIRE(run.ok() || run.status().code() == StatusCode::kInvalidArgument,
               "run_isolated: " + run.status().ToString());
  if (run.ok()) {
    FUZZ_REQUIRE(!run->program.argv.empty() && run->inputs.size() <= env::kRunIsolatedMaxInputs &&
                     run->program.files.size() <= env::kRunIsolatedMaxFiles &&
                     run->program.seconds_each > 0 && run->program.seconds_each <= 30,
                 "run_isolated: params outside their bounds");
  }
  return "";
}

// The JSON-RPC line reader: skipped, a result that is JSON text, or a FailedPrecondition. *result
// receives the result when there is one.
std::string CheckResponseLine(const std::string& line, std::optional<std::string>* result) {
  std::optional<StatusOr<std::string>> r = env::ReadJsonRpcResponse(line, 1, "peer: step");
  if (!r) return "";
  if (!r->ok()) {
    FUZZ_REQUIRE(r->status().code() == StatusCode::kFailedPrecondition,
                 "json-rpc: " + r->status().ToString());
    return "";
  }
  FUZZ_REQUIRE(!ParseUntrustedJson(**r).is_discarded(), "json-rpc: a result that is not JSON");
  *result = **r;
  return "";
}

// The calculator's two evaluators (the whole-expression tool and the one-operation tool of the
// multi-step family) on text the model wrote: a value, or an InvalidArgument / OutOfRange line.
std::string CheckCalculators(const std::string& text) {
  for (const StatusOr<calc::Rational>& r :
       {calc::EvaluateExpression(text), calc::EvaluateOneOperation(text)}) {
    FUZZ_REQUIRE(r.ok() || r.status().code() == StatusCode::kInvalidArgument ||
                     r.status().code() == StatusCode::kOutOfRange,
                 "calculate: " + r.status().ToString());
    FUZZ_REQUIRE(r.ok() || !r.status().message().empty(), "calculate: an empty error");
  }
  return "";
}

}  // namespace

const Tokenizer& FuzzTokenizer() { return *TheChat().tokenizer; }
const ChatFormat& FuzzChatFormat() { return *TheChat().format; }

std::string CheckToolCall(Mutator& m, const std::string& input) {
  if (std::string e = CheckCalculators(input); !e.empty()) return e;
  const std::vector<ToolSpec> tools = FuzzTools(m);
  ToolCall call{"call_0", m.Uniform(2) == 0 ? "calculate" : "search", input};
  if (m.Uniform(16) == 0) m.Mutate(&call.name);
  StatusOr<std::string> args = env::ValidateToolCall(call, tools);
  if (!args.ok()) {
    FUZZ_REQUIRE(args.status().code() == StatusCode::kInvalidArgument,
                 "tool call: " + args.status().ToString());
    FUZZ_REQUIRE(!args.status().message().empty(), "tool call: an empty error");
    FUZZ_REQUIRE(env::ToolError(args.status().message()).is_error,
                 "tool call: the error is not a tool error");
    return "";
  }
  // The validated arguments are an object that validates again to the same text.
  FUZZ_REQUIRE(IsJsonObject(*args), "tool call: validated arguments are not an object: " + *args);
  if (const auto a = ParseUntrustedJson(*args);
      a.contains("expression") && a["expression"].is_string()) {
    if (std::string e = CheckCalculators(a["expression"].get<std::string>()); !e.empty()) return e;
  }
  call.arguments_json = *args;
  StatusOr<std::string> again = env::ValidateToolCall(call, tools);
  FUZZ_REQUIRE(again.ok(),
               "tool call: validated arguments fail again: " + again.status().ToString());
  FUZZ_REQUIRE(*again == *args, "tool call: validating twice changed the arguments");
  return "";
}

std::string CheckAssistantTurn(Mutator& m, const std::string& input) {
  const ChatFormat& format = *TheChat().format;
  StatusOr<ParsedAssistantTurn> turn = format.ParseAssistantTurn(Ids(m, input));
  if (!turn.ok()) {
    FUZZ_REQUIRE(turn.status().code() == StatusCode::kInvalidArgument ||
                     turn.status().code() == StatusCode::kOutOfRange,
                 "parse: " + turn.status().ToString());
    return "";
  }
  for (const ToolCall& c : turn->message.tool_calls) {
    FUZZ_REQUIRE(!c.name.empty(), "parse: a tool call without a name");
    FUZZ_REQUIRE(IsJsonObject(c.arguments_json), "parse: arguments not an object");
  }
  // Round trip: rendering the parsed turn and parsing it again gives the same turn.
  StatusOr<RenderedChat> r = format.Render({turn->message});
  FUZZ_REQUIRE(r.ok(), "render of a parsed turn: " + r.status().ToString());
  FUZZ_REQUIRE(r->ids.size() == r->loss_mask.size() && r->ids.size() == r->roles.size(),
               "render: ids, mask and roles differ in length");
  StatusOr<ParsedAssistantTurn> again =
      format.ParseAssistantTurn(std::vector<int32_t>(r->ids.begin() + 1, r->ids.end()));
  FUZZ_REQUIRE(again.ok(), "parse of a rendered turn: " + again.status().ToString());
  FUZZ_REQUIRE(again->finished, "a rendered turn parses as unfinished");
  FUZZ_REQUIRE(again->message.content == turn->message.content, "round trip changed the content");
  FUZZ_REQUIRE(again->message.tool_calls.size() == turn->message.tool_calls.size(),
               "round trip changed the number of tool calls");
  for (size_t i = 0; i < again->message.tool_calls.size(); ++i) {
    FUZZ_REQUIRE(again->message.tool_calls[i].name == turn->message.tool_calls[i].name &&
                     again->message.tool_calls[i].arguments_json ==
                         turn->message.tool_calls[i].arguments_json,
                 "round trip changed a tool call");
  }
  return "";
}

std::string CheckRenderMessages(Mutator& m, const std::string& input) {
  const Chat& chat = TheChat();
  // Messages as a plug-in or a data file may hold them: any bytes in content, names, arguments.
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
      m.Uniform(2) == 0 ? chat.format->Render(messages) : chat.format->RenderPrompt(messages);
  if (!r.ok()) {
    FUZZ_REQUIRE(r.status().code() == StatusCode::kInvalidArgument,
                 "render: " + r.status().ToString());
    return "";
  }
  FUZZ_REQUIRE(r->ids.size() == r->loss_mask.size() && r->ids.size() == r->roles.size(),
               "render: ids, mask and roles differ in length");
  FUZZ_REQUIRE(chat.tokenizer->Decode(r->ids).ok(), "render: ids that do not decode");
  const RenderedChat t = chat.format->RenderText(input);
  FUZZ_REQUIRE(t.ids.back() == chat.format->end_of_text_id(), "render text: no end of text");
  return "";
}

std::string CheckExternalEnvLine(Mutator& m, const std::string& input) {
  std::optional<std::string> result;
  if (std::string e = CheckResponseLine(input, &result); !e.empty()) return e;
  if (result) {
    if (std::string e = CheckExternalResult(*result); !e.empty()) return e;
  }
  if (m.Uniform(2) == 0) return CheckExternalResult(input);
  return "";
}

std::string CheckMcpLine(Mutator& m, const std::string& input) {
  std::optional<std::string> result;
  if (std::string e = CheckResponseLine(input, &result); !e.empty()) return e;
  const std::string& text = result ? *result : input;
  StatusOr<env::McpSession> session = env::ReadMcpInitializeResult(text, "fuzz");
  FUZZ_REQUIRE(session.ok() || session.status().code() == StatusCode::kFailedPrecondition,
               "initialize: " + session.status().ToString());
  StatusOr<env::McpToolsPage> page = env::ReadMcpToolsList(text, "fuzz");
  if (!page.ok()) {
    FUZZ_REQUIRE(page.status().code() == StatusCode::kFailedPrecondition,
                 "tools/list: " + page.status().ToString());
  } else if (!page->tools.empty()) {
    // A server's schema then checks a call, as McpClient::CallTool does.
    ToolCall call{"call_0", page->tools[m.Uniform(page->tools.size())].name,
                  m.Uniform(2) == 0 ? "{}" : m.Next()};
    StatusOr<std::string> args = env::ValidateToolCall(call, page->tools);
    FUZZ_REQUIRE(!args.ok() || IsJsonObject(*args), "tools/call: arguments not an object");
  }
  const env::ToolResult call = env::ReadMcpToolCallResult(text, "fuzz");
  FUZZ_REQUIRE(call.latency_s == 0, "tools/call: a latency from nowhere");
  return "";
}

}  // namespace orrery::fuzz
