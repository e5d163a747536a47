// Exact rational numbers with overflow checks: the value type of the calculator.
//
// A Rational is num/den in lowest terms with den > 0. Every operation is exact; one whose result
// does not fit in 64-bit numerator and denominator fails with OutOfRange instead of wrapping or
// rounding, so the calculator never returns a silently wrong number.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace orrery::calc {

class Rational {
 public:
  Rational() = default;
  explicit Rational(int64_t integer) : num_(integer) {}
  // Fails when den == 0 or the reduced value does not fit.
  static StatusOr<Rational> Make(int64_t num, int64_t den);

  int64_t num() const { return num_; }
  int64_t den() const { return den_; }
  bool is_integer() const { return den_ == 1; }
  bool is_zero() const { return num_ == 0; }

  StatusOr<Rational> Add(const Rational& o) const;
  StatusOr<Rational> Sub(const Rational& o) const;
  StatusOr<Rational> Mul(const Rational& o) const;
  StatusOr<Rational> Div(const Rational& o) const;  // InvalidArgument "division by zero"
  StatusOr<Rational> Negate() const;

  // The canonical text of the value, the exact-answer format of the calc environment:
  //   an integer            "42", "-7"
  //   a terminating decimal "3.25", "-0.125"   (denominator of the form 2^a 5^b)
  //   otherwise a fraction  "7/3", "-1/6"
  std::string ToString() const;

  friend bool operator==(const Rational& a, const Rational& b) {
    return a.num_ == b.num_ && a.den_ == b.den_;
  }

 private:
  Rational(int64_t num, int64_t den) : num_(num), den_(den) {}
  static StatusOr<Rational> FromWide(__int128 num, __int128 den);

  int64_t num_ = 0;
  int64_t den_ = 1;
};

// Parses a number literal as a user or model writes an answer: an optional sign, then an integer
// ("42"), a decimal ("3.25", ".5", "1,234.5" with thousands commas) or a fraction ("13/4").
// Surrounding spaces are ignored; anything else is InvalidArgument.
StatusOr<Rational> ParseRationalLiteral(std::string_view text);

}  // namespace orrery::calc
