#include "env/calc/prompt.h"

namespace orrery::calc {

StatusOr<CalcTool> ParseCalcTool(std::string_view name) {
  if (name == "expression") return CalcTool::kExpression;
  if (name == "one_operation") return CalcTool::kOneOperation;
  return InvalidArgumentError("calc tool '" + std::string(name) +
                              "': expected expression or one_operation");
}

std::string CalculateToolSpecJson(CalcTool tool) {
  if (tool == CalcTool::kOneOperation) {
    return R"({"type":"function","function":{"name":"calculate","description":"Evaluate one arithmetic operation exactly: two numbers (integers, decimals or fractions p/q, optionally negative) and one of + - * / between them, set off by spaces. Returns an integer, a terminating decimal or a fraction p/q.","parameters":{"type":"object","properties":{"expression":{"type":"string","description":"one operation, e.g. \"12/7 * 3\"","maxLength":1024}},"required":["expression"],"additionalProperties":false}}})";
  }
  return R"({"type":"function","function":{"name":"calculate","description":"Evaluate an arithmetic expression exactly. Supports + - * / (also × ÷), parentheses, integers and decimals. Returns an integer, a terminating decimal or a fraction p/q.","parameters":{"type":"object","properties":{"expression":{"type":"string","description":"the expression, e.g. \"12 * (3 + 4) / 5\"","maxLength":1024}},"required":["expression"],"additionalProperties":false}}})";
}

std::vector<ChatMessage> CalcInitialMessages(const CalcTask& task, CalcTool tool) {
  ChatMessage system;
  system.role = ChatRole::kSystem;
  system.content =
      tool == CalcTool::kOneOperation
          ? "You are a careful assistant. You can call the tool calculate(expression) to evaluate "
            "one arithmetic operation exactly, \"a op b\"; work through longer expressions one "
            "operation at a time. Finish with a line of the form \"Answer: <value>\" where "
            "<value> is an integer, a decimal or a fraction p/q."
          : "You are a careful assistant. You can call the tool calculate(expression) to evaluate "
            "arithmetic exactly. Finish with a line of the form \"Answer: <value>\" where <value> "
            "is an integer, a decimal or a fraction p/q.";
  ChatMessage user;
  user.role = ChatRole::kUser;
  user.content = task.question;
  return {system, user};
}

}  // namespace orrery::calc
