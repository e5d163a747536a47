// Group-relative advantages (spec/rl.md §2): every trajectory of a group answers the same task,
// and its advantage is its reward relative to the group's.
//
//   grpo:     A_i = (R_i - mean_g R) / (std_g R + 1e-6)     (population std)
//   dr_grpo:  A_i =  R_i - mean_g R                          (Dr. GRPO: no std division)
//   rloo:     A_i =  R_i - mean_{j != i} R_j                 (leave-one-out baseline)
// A group whose rewards are all equal carries no signal: every advantage is 0 (the learner counts
// such groups; with the std form they would otherwise divide 0 by 1e-6).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace orrery::rl {

enum class AdvantageKind { kGrpo, kDrGrpo, kRloo };

StatusOr<AdvantageKind> ParseAdvantageKind(const std::string& name);  // grpo | dr_grpo | rloo

// Advantages of one group, in the order of `rewards`. A group of one has advantage 0 (rloo needs
// at least two members to have a baseline).
std::vector<double> GroupAdvantages(AdvantageKind kind, const std::vector<double>& rewards);

}  // namespace orrery::rl
