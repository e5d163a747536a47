// The calculator's safe expression evaluator: the `calculate(expression)` tool of the calc
// environment.
//
// Grammar (nothing else is accepted, so nothing else can run):
//   expr   := term (('+' | '-') term)*
//   term   := factor (('*' | '/') factor)*
//   factor := ('+' | '-') factor | number | '(' expr ')'
//   number := digits ['.' digits] | '.' digits
// '×' and '÷' (UTF-8) and the Unicode minus '−' are accepted as '*', '/' and '-'; spaces are
// ignored. Arithmetic is exact (calc::Rational); the result text is Rational::ToString().
// Errors are one line the model can read: "division by zero", "unexpected 'x' at position 3",
// "number too large ...". Input is bounded (kMaxExpressionBytes, kMaxNestingDepth) so evaluation
// is O(length) in time and stack.
#pragma once

#include <string_view>

#include "core/status.h"
#include "env/calc/rational.h"

namespace orrery::calc {

inline constexpr size_t kMaxExpressionBytes = 1024;
inline constexpr int kMaxNestingDepth = 64;

StatusOr<Rational> EvaluateExpression(std::string_view expression);

}  // namespace orrery::calc
