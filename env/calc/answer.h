// What counts as a correct answer in the calc environment (the reward contract).
//
// The model ends its final assistant message with a line
//     Answer: <value>
// where <value> is a number literal (ParseRationalLiteral: "42", "-7", "3.25", "13/4",
// "1,234"). The last such line of the last assistant message is the answer; it is correct when it
// is exactly equal, as a rational number, to the task's answer (so "3.25", "13/4" and "3.250"
// are all correct for 13/4, and "3.3" is not). A missing or unparsable answer line scores 0.
// "answer" is matched case-insensitively, and a trailing period is ignored.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "env/calc/rational.h"

namespace orrery::calc {

// The <value> text of the last "Answer:" line in `text`, if any.
std::optional<std::string> ExtractAnswerLine(std::string_view text);

// 1.0 when the answer line of `final_message` parses and equals `expected`, else 0.0.
double ScoreCalcAnswer(std::string_view final_message, const Rational& expected);

// The line the reference solutions (and synthetic transcripts) end with: "Answer: 13/4".
std::string FormatAnswerLine(const Rational& value);

}  // namespace orrery::calc
