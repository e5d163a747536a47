// The properties the fuzzers check (issue 27) on what reads model and plug-in bytes, shared by the
// bounded GoogleTest harness (fuzz_test.cc) and the libFuzzer entry points (libfuzzer_entry.cc).
// Each check runs one input through its readers and returns the first broken property as one
// line, or "" when every property held; the input must give a value or a Status error — a crash,
// an abort or an escaping exception is a failure of the caller's harness. `m` supplies the other
// choices a check makes (a mutated schema, another input, an odd token id).
#pragma once

#include <string>

#include "model/chat_format.h"
#include "model/tokenizer.h"
#include "tests/fuzz/mutator.h"

namespace orrery::fuzz {

// The tokenizer (350 ids, the chat special tokens) and chat format the chat checks use, trained
// once on a few calculator turns.
const Tokenizer& FuzzTokenizer();
const ChatFormat& FuzzChatFormat();

// The corpus directory name of each target under tests/fixtures/fuzz/.
inline constexpr const char* kToolCallCorpus = "tool_call";
inline constexpr const char* kChatFormatCorpus = "chat_format";
inline constexpr const char* kExternalEnvCorpus = "external_env";
inline constexpr const char* kMcpCorpus = "mcp";

// The calculator's evaluators (whole expression and one operation) on the input as a tool
// argument: a value, InvalidArgument or OutOfRange. Then env::ValidateToolCall against the
// calculator's schema and one using every keyword it checks: an error is InvalidArgument and a
// tool error; a valid call's arguments are an object that validates again to the same text.
std::string CheckToolCall(Mutator& m, const std::string& input);
// The chat format's parser on the ids of `input` (chat markers as special tokens, sometimes an id
// outside the vocabulary): an error is InvalidArgument or OutOfRange; a parsed turn renders and
// parses back to the same turn.
std::string CheckAssistantTurn(Mutator& m, const std::string& input);
// Render / RenderPrompt of messages holding any bytes: OK or InvalidArgument; ids, masks and roles
// of one length, ids that decode; RenderText ends with end-of-text.
std::string CheckRenderMessages(Mutator& m, const std::string& input);
// An orrery-env/1 reply line through the JSON-RPC reader and every reply reader (describe, reset,
// step, score): values or FailedPrecondition errors, tool schemas that parse.
std::string CheckExternalEnvLine(Mutator& m, const std::string& input);
// An MCP JSON-RPC line: server name, tools/list (a listed tool's schema then checks a call),
// tools/call results.
std::string CheckMcpLine(Mutator& m, const std::string& input);

}  // namespace orrery::fuzz
