#include "env/calc/transcripts.h"

#include <nlohmann/json.hpp>

#include "core/philox.h"
#include "env/calc/answer.h"
#include "env/calc/expression.h"
#include "env/calc/one_operation.h"
#include "env/calc/prompt.h"

namespace orrery::calc {
namespace {

// Streams of the transcript's own draws (the task has its own, see task.cc).
constexpr uint64_t kTranscriptStream = 0x7472616E73ull;  // "trans"

constexpr const char* kToolPreambles[] = {"", "Let me compute that.", "I'll use the calculator.",
                                          "Let me check with the calculator."};
constexpr const char* kFinalPhrases[] = {"The result is %s.", "So the value is %s.",
                                         "%s is the exact result.", "That gives %s."};

std::string Fill(std::string_view tmpl, const std::string& value) {
  const size_t at = tmpl.find("%s");
  return std::string(tmpl.substr(0, at)) + value + std::string(tmpl.substr(at + 2));
}

// A plausible wrong answer: a fraction rounded to the nearest integer, or the exact value shifted
// by a small non-zero integer.
Rational WrongAnswer(const Rational& exact, PhiloxGenerator& rng) {
  if (!exact.is_integer() && rng.UniformInt(2) == 0) {
    const int64_t rounded = exact.num() / exact.den();  // truncation toward zero
    return Rational(rounded);
  }
  int64_t delta = 1 + static_cast<int64_t>(rng.UniformInt(10));
  if (rng.UniformInt(2) == 0) delta = -delta;
  StatusOr<Rational> shifted = exact.Add(Rational(delta));
  return shifted.ok() ? *shifted : Rational(delta);
}

}  // namespace

Status ValidateTranscriptOptions(const TranscriptOptions& o) {
  if (o.difficulty != 0 && (o.difficulty < kMinDifficulty || o.difficulty > kMaxDifficulty)) {
    return InvalidArgumentError("calc difficulty " + std::to_string(o.difficulty) +
                                " is outside [1, 4] (or 0 for a mix)");
  }
  if (!(o.no_tool_fraction >= 0 && o.no_tool_fraction <= 1)) {
    return InvalidArgumentError("no_tool_fraction must be in [0, 1]");
  }
  if (!(o.no_tool_error_rate >= 0 && o.no_tool_error_rate <= 1)) {
    return InvalidArgumentError("no_tool_error_rate must be in [0, 1]");
  }
  return Status::OK();
}

StatusOr<CalcTranscript> MakeCalcTranscript(uint64_t seed, uint64_t index,
                                            const TranscriptOptions& options) {
  ORRERY_RETURN_IF_ERROR(ValidateTranscriptOptions(options));
  PhiloxGenerator rng(seed ^ kTranscriptStream, index);
  const int difficulty = options.difficulty != 0
                             ? options.difficulty
                             : kMinDifficulty + static_cast<int>(rng.UniformInt(kMaxDifficulty));
  CalcTranscript out;
  ORRERY_ASSIGN_OR_RETURN(out.task, MakeCalcTask(seed, options.split, index, difficulty));
  out.messages = CalcInitialMessages(out.task, options.tool);

  // Uniform() is in (0, 1]: `u <= p` happens with probability p, never for p = 0.
  const bool no_tool = rng.Uniform() <= options.no_tool_fraction && options.no_tool_fraction > 0;
  ChatMessage final_message;
  final_message.role = ChatRole::kAssistant;
  if (no_tool) {
    const bool wrong =
        rng.Uniform() <= options.no_tool_error_rate && options.no_tool_error_rate > 0;
    const Rational given = wrong ? WrongAnswer(out.task.answer, rng) : out.task.answer;
    final_message.content = FormatAnswerLine(given);
  } else if (options.tool == CalcTool::kOneOperation) {
    ORRERY_ASSIGN_OR_RETURN(std::vector<OperationStep> steps,
                            OneOperationSteps(out.task.expression));
    for (size_t i = 0; i < steps.size(); ++i) {
      const std::string id = "call_" + std::to_string(i);
      ChatMessage call;
      call.role = ChatRole::kAssistant;
      if (i == 0) call.content = kToolPreambles[rng.UniformInt(std::size(kToolPreambles))];
      call.tool_calls.push_back(
          ToolCall{id, kCalculateTool, nlohmann::json{{"expression", steps[i].text}}.dump()});
      out.messages.push_back(call);
      ChatMessage result;
      result.role = ChatRole::kTool;
      result.tool_call_id = id;
      result.name = kCalculateTool;
      result.content = steps[i].value.ToString();
      out.messages.push_back(result);
    }
    const Rational& value = steps.empty() ? out.task.answer : steps.back().value;
    final_message.content =
        Fill(kFinalPhrases[rng.UniformInt(std::size(kFinalPhrases))], value.ToString()) + "\n" +
        FormatAnswerLine(value);
    out.used_tool = !steps.empty();
  } else {
    ChatMessage call;
    call.role = ChatRole::kAssistant;
    call.content = kToolPreambles[rng.UniformInt(std::size(kToolPreambles))];
    call.tool_calls.push_back(ToolCall{"call_0", kCalculateTool,
                                       nlohmann::json{{"expression", out.task.expression}}.dump()});
    out.messages.push_back(call);
    ChatMessage result;
    result.role = ChatRole::kTool;
    result.tool_call_id = "call_0";
    result.name = kCalculateTool;
    ORRERY_ASSIGN_OR_RETURN(Rational value, EvaluateExpression(out.task.expression));
    result.content = value.ToString();
    out.messages.push_back(result);
    final_message.content =
        Fill(kFinalPhrases[rng.UniformInt(std::size(kFinalPhrases))], result.content) + "\n" +
        FormatAnswerLine(value);
    out.used_tool = true;
  }
  out.correct = ScoreCalcAnswer(final_message.content, out.task.answer) == 1.0;
  out.messages.push_back(std::move(final_message));
  return out;
}

}  // namespace orrery::calc
