// What the model sees at the start of a calc episode: the system prompt, the user question and the
// `calculate` tool's spec. Shared by the environment (reset) and the synthetic transcripts, so
// pretraining data and RL episodes look the same to the model.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/chat.h"
#include "env/calc/task.h"

namespace orrery::calc {

// The name of the one calc tool and its JSON Schema for arguments.
inline constexpr const char* kCalculateTool = "calculate";

// What `calculate` evaluates: a whole expression (expression.h), or one operation at a time
// (one_operation.h: the multi-step family, n - 1 calls for n operands).
enum class CalcTool { kExpression, kOneOperation };

// "expression" | "one_operation".
StatusOr<CalcTool> ParseCalcTool(std::string_view name);

// The tool spec in the common function-calling shape:
// {"type":"function","function":{"name":"calculate","description":...,"parameters":{...}}}
std::string CalculateToolSpecJson(CalcTool tool = CalcTool::kExpression);

// [system, user] for `task`. The system prompt states the tool and the "Answer: <value>" rule.
std::vector<ChatMessage> CalcInitialMessages(const CalcTask& task,
                                             CalcTool tool = CalcTool::kExpression);

}  // namespace orrery::calc
