#include "env/calc/prompt.h"

namespace orrery::calc {

std::string CalculateToolSpecJson() {
  return R"({"type":"function","function":{"name":"calculate","description":"Evaluate an arithmetic expression exactly. Supports + - * / (also × ÷), parentheses, integers and decimals. Returns an integer, a terminating decimal or a fraction p/q.","parameters":{"type":"object","properties":{"expression":{"type":"string","description":"the expression, e.g. \"12 * (3 + 4) / 5\"","maxLength":1024}},"required":["expression"],"additionalProperties":false}}})";
}

std::vector<ChatMessage> CalcInitialMessages(const CalcTask& task) {
  ChatMessage system;
  system.role = ChatRole::kSystem;
  system.content =
      "You are a careful assistant. You can call the tool calculate(expression) to evaluate "
      "arithmetic exactly. Finish with a line of the form \"Answer: <value>\" where <value> is an "
      "integer, a decimal or a fraction p/q.";
  ChatMessage user;
  user.role = ChatRole::kUser;
  user.content = task.question;
  return {system, user};
}

}  // namespace orrery::calc
