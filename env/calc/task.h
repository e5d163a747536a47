// The arithmetic task source of the calc environment.
//
// A task is a pure function of (seed, split, index): the same triple gives the same question on
// every machine. Difficulty sets the operand count, the operators and the number kinds:
//   1: a ± b, integers 0..99
//   2: three operands, + - *, integers 0..999
//   3: four operands, + - * /, integers 1..999 (results may be fractions)
//   4: five operands, + - * /, decimals with up to two places
// The train and test splits are disjoint by construction: an expression belongs to the test split
// exactly when its FNV-1a hash is divisible by 8, and each split draws until it gets one of its
// own (so a test question never appears in train, whatever the seeds).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "env/calc/rational.h"
#include "env/split.h"

namespace orrery::calc {

using env::ParseSplit;
using env::Split;
using env::SplitName;

inline constexpr int kMinDifficulty = 1;
inline constexpr int kMaxDifficulty = 4;

struct CalcTask {
  std::string id;  // "calc/train/d2/<seed>/<index>"
  Split split = Split::kTrain;
  int difficulty = 1;
  std::string expression;   // ASCII operators, e.g. "12 * (3 + 4)"
  std::string question;     // the user message, e.g. "What is 12 * (3 + 4)?"
  Rational answer;          // exact value of `expression`
  std::string answer_text;  // answer.ToString(), the canonical exact answer
};

// difficulty in [kMinDifficulty, kMaxDifficulty], else InvalidArgument.
StatusOr<CalcTask> MakeCalcTask(uint64_t seed, Split split, uint64_t index, int difficulty);

// True when `expression` belongs to the test split (the hash rule above).
bool IsTestExpression(std::string_view expression);

}  // namespace orrery::calc
