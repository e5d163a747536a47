#include "env/calc/answer.h"

#include <cctype>

namespace orrery::calc {

std::optional<std::string> ExtractAnswerLine(std::string_view text) {
  std::optional<std::string> found;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front()))) {
      line.remove_prefix(1);
    }
    if (line.size() >= 7) {
      std::string head(line.substr(0, 7));
      for (char& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (head == "answer:") {
        std::string_view value = line.substr(7);
        while (!value.empty() && std::isspace(static_cast<unsigned char>(value.back()))) {
          value.remove_suffix(1);
        }
        if (!value.empty() && value.back() == '.') value.remove_suffix(1);
        found = std::string(value);
      }
    }
    start = end + 1;
  }
  return found;
}

double ScoreCalcAnswer(std::string_view final_message, const Rational& expected) {
  std::optional<std::string> line = ExtractAnswerLine(final_message);
  if (!line) return 0.0;
  StatusOr<Rational> value = ParseRationalLiteral(*line);
  return value.ok() && *value == expected ? 1.0 : 0.0;
}

std::string FormatAnswerLine(const Rational& value) { return "Answer: " + value.ToString(); }

}  // namespace orrery::calc
