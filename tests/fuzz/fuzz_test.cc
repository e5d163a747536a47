// Bounded mutation fuzzing (issue 27) of what reads model and plug-in bytes — the tool-call
// parser, the chat format, the orrery-env/1 JSON-lines replies and the MCP JSON-RPC reader — in
// every build (fuzz_harness.h over the checks of fuzz_checks.h), plus the crashes the fuzzers
// found, kept as regression tests.
#include <gtest/gtest.h>

#include <string>

#include "core/json_text.h"
#include "env/external/external_env.h"
#include "env/external/json_rpc_channel.h"
#include "env/mcp/mcp_client.h"
#include "env/tool_call.h"
#include "tests/fuzz/fuzz_checks.h"
#include "tests/fuzz/fuzz_harness.h"

namespace orrery {
namespace {

using fuzz::Mutator;
using fuzz::RunFuzzer;

// A check as a RunFuzzer body: its first broken property is a test failure.
auto Expect(std::string (*check)(Mutator&, const std::string&)) {
  return [check](Mutator& m, const std::string& input) { EXPECT_EQ(check(m, input), ""); };
}

TEST(FuzzTest, ToolCallParser) {
  EXPECT_GT(RunFuzzer(fuzz::kToolCallCorpus, Expect(fuzz::CheckToolCall)), 0);
}

TEST(FuzzTest, ChatFormatParsesAndRendersAssistantTurns) {
  EXPECT_GT(RunFuzzer(fuzz::kChatFormatCorpus, Expect(fuzz::CheckAssistantTurn)), 0);
}

TEST(FuzzTest, ChatFormatRendersAnyMessages) {
  EXPECT_GT(RunFuzzer(fuzz::kChatFormatCorpus, Expect(fuzz::CheckRenderMessages)), 0);
}

TEST(FuzzTest, ExternalEnvJsonLines) {
  EXPECT_GT(RunFuzzer(fuzz::kExternalEnvCorpus, Expect(fuzz::CheckExternalEnvLine)), 0);
}

TEST(FuzzTest, McpJsonRpcReader) {
  EXPECT_GT(RunFuzzer(fuzz::kMcpCorpus, Expect(fuzz::CheckMcpLine)), 0);
}

// The second crash the fuzzer found: a tool call whose name is not UTF-8 threw type_error 316
// out of Render (nlohmann's dump); the name's invalid bytes now render as U+FFFD.
TEST(FuzzTest, ToolCallNameThatIsNotUtf8Renders) {
  ChatMessage m{ChatRole::kAssistant, "", {{"call_0", "calc\xa6", R"({"x":1})"}}, "", ""};
  StatusOr<RenderedChat> r = fuzz::FuzzChatFormat().Render({m});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NE(fuzz::FuzzTokenizer().Decode(r->ids)->find("calc\xef\xbf\xbd"), std::string::npos);
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
