// The one-operation calculator of the calc environment's multi-step family ([env.calc] tool =
// "one_operation"): calculate("a op b") evaluates exactly one of + - * / (also × ÷) between two
// numbers written as the tool itself writes them (an integer, a decimal or a fraction p/q, with
// an optional leading '-'), the operator set off by spaces. A task of n operands then takes n - 1
// calls, each but the first using an earlier result: tool use over several steps, with the
// answer known only at the end (issue 26, multi-step tasks).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "env/calc/rational.h"

namespace orrery::calc {

// "12/7 * 3" -> 36/7. Anything else (no operator, two operators, an expression, a missing space)
// is one InvalidArgument line the model reads as a tool error.
StatusOr<Rational> EvaluateOneOperation(std::string_view text);

// One call of a one-operation solution: its argument ("a op b") and the value it returns.
struct OperationStep {
  std::string text;
  Rational value;
};

// The operations that evaluate `expression` (the task grammar of expression.h: numbers, + - * /,
// parentheses) one at a time, each after the steps whose results it uses; the last step's value
// is the expression's. An expression that is a single number has no steps.
StatusOr<std::vector<OperationStep>> OneOperationSteps(std::string_view expression);

}  // namespace orrery::calc
