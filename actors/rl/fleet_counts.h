// How many instances of a role the run's [fleet] declares (an RL actor's world size: rollout
// actors split the task stream by it, learner ranks form a Gloo group of that size).
#pragma once

#include <string>

#include "core/config.h"

namespace orrery::rl_actors {

// The `count` of [[fleet.roles]] entry `role`; 1 when [fleet] does not list it.
int FleetRoleCount(ConfigTable& root, const std::string& role);
// Whether [fleet] lists `role`.
bool FleetHasRole(ConfigTable& root, const std::string& role);

}  // namespace orrery::rl_actors
