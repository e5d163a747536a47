// Checking a model's tool call before it reaches a tool: the common part of every Step().
//
// The model writes tool calls as text, so anything can arrive. ParseToolArguments turns a call
// into a JSON object that satisfies the tool's schema, or into the one-line error the model will
// read as the tool result:
//   unknown tool 'foo' (available: calculate)
//   arguments are not valid JSON: <parser message>
//   argument 'expression': expected a string, got number
//   missing required argument 'expression'
//   unexpected argument 'x' (allowed: expression)
// The schema subset checked is what function-calling tools use: "type" object at the top,
// "properties" with type string / integer / number / boolean / array / object, "required",
// "additionalProperties": false, and "maxLength" / "minimum" / "maximum" / "enum". Anything else
// in the schema is passed through unchecked for the tool itself to validate.
#pragma once

#include <string>
#include <vector>

#include "core/chat.h"
#include "core/status.h"
#include "env/env.h"

namespace orrery::env {

// Finds the tool named by `call` in `tools` and validates its arguments. On success returns the
// arguments as compact JSON text (an object); on failure an InvalidArgument whose message is
// meant for the model.
StatusOr<std::string> ValidateToolCall(const ToolCall& call, const std::vector<ToolSpec>& tools);

// The error ToolResult for a model mistake: content "error: <message>", is_error set.
ToolResult ToolError(const std::string& message);

}  // namespace orrery::env
