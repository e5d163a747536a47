#include "env/calc/one_operation.h"

#include <cctype>

#include "env/calc/expression.h"

namespace orrery::calc {
namespace {

constexpr const char* kUsage =
    "the calculator takes one operation at a time: \"<number> <op> <number>\" with one of + - * / "
    "between two numbers, set off by spaces (e.g. \"12/7 * 3\")";

StatusOr<Rational> Apply(const Rational& a, std::string_view op, const Rational& b) {
  if (op == "+") return a.Add(b);
  if (op == "-" || op == "\u2212") return a.Sub(b);
  if (op == "*" || op == "\u00d7") return a.Mul(b);
  if (op == "/" || op == "\u00f7") return a.Div(b);
  return InvalidArgumentError(std::string(kUsage) + "; '" + std::string(op) +
                              "' is not an operator");
}

// A recursive-descent walk of the task grammar that records each binary operation as it is
// evaluated (operands first), with the operands' values rendered as the tool renders results.
class StepRecorder {
 public:
  explicit StepRecorder(std::string_view s) : s_(s) {}

  StatusOr<std::vector<OperationStep>> Run() {
    ORRERY_ASSIGN_OR_RETURN(Rational v, Expr(0));
    (void)v;
    Skip();
    if (at_ != s_.size()) return Unexpected();
    return std::move(steps_);
  }

 private:
  StatusOr<Rational> Expr(int depth) {
    ORRERY_ASSIGN_OR_RETURN(Rational v, Term(depth));
    while (true) {
      Skip();
      if (at_ >= s_.size() || (s_[at_] != '+' && s_[at_] != '-')) return v;
      const char op = s_[at_++];
      ORRERY_ASSIGN_OR_RETURN(Rational r, Term(depth));
      ORRERY_ASSIGN_OR_RETURN(v, Record(v, op, r));
    }
  }
  StatusOr<Rational> Term(int depth) {
    ORRERY_ASSIGN_OR_RETURN(Rational v, Factor(depth));
    while (true) {
      Skip();
      if (at_ >= s_.size() || (s_[at_] != '*' && s_[at_] != '/')) return v;
      const char op = s_[at_++];
      ORRERY_ASSIGN_OR_RETURN(Rational r, Factor(depth));
      ORRERY_ASSIGN_OR_RETURN(v, Record(v, op, r));
    }
  }
  StatusOr<Rational> Factor(int depth) {
    if (depth > kMaxNestingDepth) return InvalidArgumentError("expression nested too deeply");
    Skip();
    if (at_ < s_.size() && s_[at_] == '(') {
      ++at_;
      ORRERY_ASSIGN_OR_RETURN(Rational v, Expr(depth + 1));
      Skip();
      if (at_ >= s_.size() || s_[at_] != ')') return Unexpected();
      ++at_;
      return v;
    }
    const size_t start = at_;
    while (at_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[at_])) || s_[at_] == '.'))
      ++at_;
    if (at_ == start) return Unexpected();
    return ParseRationalLiteral(s_.substr(start, at_ - start));
  }
  StatusOr<Rational> Record(const Rational& a, char op, const Rational& b) {
    ORRERY_ASSIGN_OR_RETURN(Rational v, Apply(a, std::string_view(&op, 1), b));
    steps_.push_back({a.ToString() + " " + op + " " + b.ToString(), v});
    return v;
  }
  void Skip() {
    while (at_ < s_.size() && s_[at_] == ' ') ++at_;
  }
  Status Unexpected() const {
    return InvalidArgumentError(
        "unexpected " +
        (at_ < s_.size() ? "'" + std::string(1, s_[at_]) + "'" : std::string("end")) +
        " at position " + std::to_string(at_));
  }

  std::string_view s_;
  size_t at_ = 0;
  std::vector<OperationStep> steps_;
};

}  // namespace

StatusOr<Rational> EvaluateOneOperation(std::string_view text) {
  if (text.size() > kMaxExpressionBytes) {
    return InvalidArgumentError(std::string(kUsage) + "; the argument is too long");
  }
  std::vector<std::string_view> parts;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    const size_t start = i;
    while (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    if (i > start) parts.push_back(text.substr(start, i - start));
  }
  if (parts.size() != 3) {
    return InvalidArgumentError(std::string(kUsage) + "; got " + std::to_string(parts.size()) +
                                " space-separated parts");
  }
  StatusOr<Rational> a = ParseRationalLiteral(parts[0]);
  StatusOr<Rational> b = ParseRationalLiteral(parts[2]);
  if (!a.ok() || !b.ok()) {
    return InvalidArgumentError(std::string(kUsage) + "; '" +
                                std::string(!a.ok() ? parts[0] : parts[2]) + "' is not a number");
  }
  return Apply(*a, parts[1], *b);
}

StatusOr<std::vector<OperationStep>> OneOperationSteps(std::string_view expression) {
  if (expression.size() > kMaxExpressionBytes) return InvalidArgumentError("expression too long");
  return StepRecorder(expression).Run();
}

}  // namespace orrery::calc
