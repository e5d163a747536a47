#include "env/calc/expression.h"

#include <cctype>
#include <string>

namespace orrery::calc {
namespace {

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  StatusOr<Rational> Run() {
    ORRERY_ASSIGN_OR_RETURN(Rational value, Expr());
    SkipSpaces();
    if (pos_ != text_.size()) return Unexpected();
    return value;
  }

 private:
  // Normalises the next operator character: returns '+', '-', '*', '/', '(', ')', or 0 for
  // anything else, and its byte length in *len.
  char PeekOp(size_t* len) {
    SkipSpaces();
    *len = 1;
    if (pos_ >= text_.size()) return 0;
    const std::string_view rest = text_.substr(pos_);
    if (rest.starts_with("\xC3\x97")) return *len = 2, '*';      // ×
    if (rest.starts_with("\xC3\xB7")) return *len = 2, '/';      // ÷
    if (rest.starts_with("\xE2\x88\x92")) return *len = 3, '-';  // −
    const char c = rest[0];
    if (c == '+' || c == '-' || c == '*' || c == '/' || c == '(' || c == ')') return c;
    return 0;
  }

  void SkipSpaces() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
  }

  Status Unexpected() {
    if (pos_ >= text_.size()) return InvalidArgumentError("unexpected end of expression");
    std::string shown(1, text_[pos_]);
    if (static_cast<unsigned char>(text_[pos_]) >= 0x80 || !std::isprint(text_[pos_])) {
      shown = "non-ASCII character";
    }
    return InvalidArgumentError("unexpected '" + shown + "' at position " +
                                std::to_string(pos_ + 1) +
                                " (allowed: numbers, + - * / and parentheses)");
  }

  StatusOr<Rational> Expr() {
    ORRERY_ASSIGN_OR_RETURN(Rational value, Term());
    for (;;) {
      size_t len;
      const char op = PeekOp(&len);
      if (op != '+' && op != '-') return value;
      pos_ += len;
      ORRERY_ASSIGN_OR_RETURN(Rational rhs, Term());
      ORRERY_ASSIGN_OR_RETURN(value, op == '+' ? value.Add(rhs) : value.Sub(rhs));
    }
  }

  StatusOr<Rational> Term() {
    ORRERY_ASSIGN_OR_RETURN(Rational value, Factor());
    for (;;) {
      size_t len;
      const char op = PeekOp(&len);
      if (op != '*' && op != '/') return value;
      pos_ += len;
      ORRERY_ASSIGN_OR_RETURN(Rational rhs, Factor());
      ORRERY_ASSIGN_OR_RETURN(value, op == '*' ? value.Mul(rhs) : value.Div(rhs));
    }
  }

  StatusOr<Rational> Factor() {
    if (++depth_ > kMaxNestingDepth) {
      return InvalidArgumentError("expression nested deeper than " +
                                  std::to_string(kMaxNestingDepth) + " levels");
    }
    StatusOr<Rational> result = FactorInner();
    --depth_;
    return result;
  }

  StatusOr<Rational> FactorInner() {
    size_t len;
    const char op = PeekOp(&len);
    if (op == '+' || op == '-') {
      pos_ += len;
      ORRERY_ASSIGN_OR_RETURN(Rational inner, Factor());
      if (op == '+') return inner;
      return inner.Negate();
    }
    if (op == '(') {
      pos_ += len;
      ORRERY_ASSIGN_OR_RETURN(Rational inner, Expr());
      if (PeekOp(&len) != ')') {
        if (pos_ >= text_.size()) return InvalidArgumentError("missing ')'");
        return Unexpected();
      }
      pos_ += len;
      return inner;
    }
    return Number();
  }

  StatusOr<Rational> Number() {
    SkipSpaces();
    const size_t start = pos_;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
    }
    const std::string_view literal = text_.substr(start, pos_ - start);
    if (literal.empty() || literal == ".") {
      pos_ = start;
      return Unexpected();
    }
    StatusOr<Rational> value = ParseRationalLiteral(literal);
    if (!value.ok()) {
      return Status(value.status().code(), "number at position " + std::to_string(start + 1) +
                                               ": " + value.status().message());
    }
    return value;
  }

  std::string_view text_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

StatusOr<Rational> EvaluateExpression(std::string_view expression) {
  if (expression.size() > kMaxExpressionBytes) {
    return InvalidArgumentError("expression longer than " + std::to_string(kMaxExpressionBytes) +
                                " bytes");
  }
  return Parser(expression).Run();
}

}  // namespace orrery::calc
