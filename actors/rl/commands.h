// The RL phase's CLI: the [rl] config section, the "rollout" and "learner" actor roles, and
// `orrery rl eval` (pass rate of a checkpoint on an environment's test tasks).
#pragma once

#include "core/cli.h"

namespace orrery::rl_actors {

void RegisterRlCommands(CliRegistry& registry);

}  // namespace orrery::rl_actors
