// The RL phase's actor roles (docs/rl.md):
//   "rollout"  generates groups of episodes on the newest published policy and inserts them into
//              the replay store;
//   "learner"  samples groups, updates the policy (decoupled PPO / GRPO), publishes each version,
//              checkpoints; learner ranks are data parallel over Gloo.
// Both read [rl], [env] and [fleet] from the run's config and RUN/rl/launch.json from the
// launcher. They pull their work (tasks, weights, samples) and serve no requests.
#pragma once

#include "actors/runtime/role.h"

namespace orrery::rl_actors {

Status RolloutMain(ActorContext& ctx);  // rollout_role.cc
Status LearnerMain(ActorContext& ctx);  // learner_role.cc

}  // namespace orrery::rl_actors
