#include "env/calc/rational.h"

#include <cctype>
#include <limits>

namespace orrery::calc {
namespace {

constexpr __int128 kMax = std::numeric_limits<int64_t>::max();

__int128 Abs(__int128 x) { return x < 0 ? -x : x; }

__int128 Gcd(__int128 a, __int128 b) {
  a = Abs(a);
  b = Abs(b);
  while (b != 0) {
    __int128 t = a % b;
    a = b;
    b = t;
  }
  return a;
}

// Products of two int64 values always fit in __int128; sums of two such products may not, so
// inputs are reduced before multiplying and every intermediate stays below 2^126.
Status TooLarge() {
  return OutOfRangeError(
      "number too large (exact results are limited to 64-bit numerator and "
      "denominator)");
}

}  // namespace

StatusOr<Rational> Rational::FromWide(__int128 num, __int128 den) {
  if (den == 0) return InvalidArgumentError("division by zero");
  if (den < 0) {
    num = -num;
    den = -den;
  }
  const __int128 g = Gcd(num, den);
  if (g > 1) {
    num /= g;
    den /= g;
  }
  if (Abs(num) > kMax || den > kMax) return TooLarge();
  return Rational(static_cast<int64_t>(num), static_cast<int64_t>(den));
}

StatusOr<Rational> Rational::Make(int64_t num, int64_t den) { return FromWide(num, den); }

StatusOr<Rational> Rational::Add(const Rational& o) const {
  return FromWide(static_cast<__int128>(num_) * o.den_ + static_cast<__int128>(o.num_) * den_,
                  static_cast<__int128>(den_) * o.den_);
}

StatusOr<Rational> Rational::Sub(const Rational& o) const {
  return FromWide(static_cast<__int128>(num_) * o.den_ - static_cast<__int128>(o.num_) * den_,
                  static_cast<__int128>(den_) * o.den_);
}

StatusOr<Rational> Rational::Mul(const Rational& o) const {
  return FromWide(static_cast<__int128>(num_) * o.num_, static_cast<__int128>(den_) * o.den_);
}

StatusOr<Rational> Rational::Div(const Rational& o) const {
  if (o.num_ == 0) return InvalidArgumentError("division by zero");
  return FromWide(static_cast<__int128>(num_) * o.den_, static_cast<__int128>(den_) * o.num_);
}

StatusOr<Rational> Rational::Negate() const { return FromWide(-static_cast<__int128>(num_), den_); }

std::string Rational::ToString() const {
  auto wide_to_string = [](__int128 v) {
    if (v == 0) return std::string("0");
    std::string s;
    const bool neg = v < 0;
    v = Abs(v);
    while (v > 0) {
      s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
      v /= 10;
    }
    return neg ? "-" + s : s;
  };
  if (den_ == 1) return wide_to_string(num_);
  // Terminating decimal: den = 2^a 5^b, scale by 10^max(a, b).
  int64_t d = den_;
  int twos = 0, fives = 0;
  while (d % 2 == 0) d /= 2, ++twos;
  while (d % 5 == 0) d /= 5, ++fives;
  const int digits = twos > fives ? twos : fives;
  // At most 18 decimals: |num| < 2^63 times 10^18/den <= 5^18 stays far below 2^127.
  if (d == 1 && digits <= 18) {
    __int128 scale = 1;
    for (int i = 0; i < digits; ++i) scale *= 10;
    const __int128 scaled = Abs(num_) * (scale / den_);  // exact: den_ divides 10^digits
    std::string whole = wide_to_string(scaled / scale);
    std::string frac = wide_to_string(scaled % scale);
    frac.insert(frac.begin(), static_cast<size_t>(digits) - frac.size(), '0');
    return (num_ < 0 ? "-" : "") + whole + "." + frac;
  }
  return wide_to_string(num_) + "/" + wide_to_string(den_);
}

StatusOr<Rational> ParseRationalLiteral(std::string_view text) {
  auto bad = [&text](std::string_view why) {
    return InvalidArgumentError("'" + std::string(text.substr(0, 64)) + "' is not a number (" +
                                std::string(why) + ")");
  };
  size_t b = 0, e = text.size();
  while (b < e && (text[b] == ' ' || text[b] == '\t')) ++b;
  while (e > b && (text[e - 1] == ' ' || text[e - 1] == '\t')) --e;
  std::string_view t = text.substr(b, e - b);
  if (t.empty()) return bad("empty");
  bool negative = false;
  if (t[0] == '+' || t[0] == '-') {
    negative = t[0] == '-';
    t.remove_prefix(1);
  }
  // Integer part (with optional thousands commas), optional fraction digits, optional "/den".
  __int128 num = 0, den = 1;
  int digits = 0;
  size_t i = 0;
  auto push_digit = [&](char c) -> bool {
    num = num * 10 + (c - '0');
    return ++digits <= 18;
  };
  for (; i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == ','); ++i) {
    if (t[i] == ',') continue;
    if (!push_digit(t[i])) return bad("more than 18 digits");
  }
  if (i < t.size() && t[i] == '.') {
    ++i;
    for (; i < t.size() && std::isdigit(static_cast<unsigned char>(t[i])); ++i) {
      if (!push_digit(t[i])) return bad("more than 18 digits");
      den *= 10;
    }
  }
  if (digits == 0) return bad("no digits");
  if (i < t.size() && t[i] == '/') {
    if (den != 1) return bad("a fraction needs integer parts");
    ++i;
    __int128 d = 0;
    int ddigits = 0;
    for (; i < t.size() && std::isdigit(static_cast<unsigned char>(t[i])); ++i) {
      d = d * 10 + (t[i] - '0');
      if (++ddigits > 18) return bad("more than 18 digits");
    }
    if (ddigits == 0) return bad("no denominator");
    if (d == 0) return bad("zero denominator");
    den = d;
  }
  if (i != t.size()) return bad("unexpected '" + std::string(1, t[i]) + "'");
  return Rational::Make(static_cast<int64_t>(negative ? -num : num), static_cast<int64_t>(den));
}

}  // namespace orrery::calc
