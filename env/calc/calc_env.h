// The calc environment: arithmetic questions, the `calculate` tool, exact-answer reward.
//
// Options ([env.calc]):
//   seed = 0              task seed (tasks are a pure function of seed, split, index)
//   difficulty = 0        1..4, or 0: task i gets difficulty 1 + i % 4
//   difficulties = []     a mix instead: task i gets one of them by a hash of i (e.g. [2, 3];
//                         not with difficulty)
//   max_tool_calls = 16   calls beyond this get an error result
//   tool = "expression"   what calculate takes: a whole expression, or "one_operation" (one
//                         operation a call: the multi-step family, n - 1 calls for n operands)
// Reward: 1 when the final "Answer:" line is exactly right (docs/env.md), else 0.
// Components: "correct", "tool_calls" (how many the model made).
// Families (env::Env::Family): "calc/d<difficulty>" (with one_operation, difficulty d takes d
// calls).
#pragma once

#include <memory>
#include <vector>

#include "core/config.h"
#include "env/calc/prompt.h"
#include "env/env.h"

namespace orrery::calc {

struct CalcEnvOptions {
  uint64_t seed = 0;
  int difficulty = 0;
  std::vector<int> difficulties;  // non-empty: the mix (difficulty is then 0)
  int max_tool_calls = 16;
  CalcTool tool = CalcTool::kExpression;
};

CalcEnvOptions ReadCalcEnvOptions(ConfigTable& table);
std::unique_ptr<env::Env> MakeCalcEnv(const CalcEnvOptions& options);

}  // namespace orrery::calc
