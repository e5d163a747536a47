// The RL actors' glue between the three views of one trajectory:
//   rollout::Trajectory  what the agent loop builds (rollout/trajectory.h)
//   replay::Trajectory   what the replay store holds (Cap'n Proto, actors/replay/trajectory.h)
//   rl::PolicySample     what the learner consumes (learner/rl/rl_trainer.h)
// Token columns are copied verbatim: the learner never re-tokenises.
#pragma once

#include <vector>

#include "actors/replay/trajectory.h"
#include "core/status.h"
#include "learner/rl/rl_trainer.h"
#include "rollout/agent_loop.h"

namespace orrery::rl_actors {

replay::Trajectory ToReplayTrajectory(const rollout::Trajectory& t);
// InvalidArgument (from replay::ValidateTrajectory) when the columns are inconsistent.
StatusOr<rl::PolicySample> ToPolicySample(const replay::Trajectory& t);
// A sampled replay item (one group's encoded trajectories) as a learner group.
StatusOr<rl::PolicyGroup> DecodeGroup(uint64_t group_id, const std::vector<std::string>& encoded);

}  // namespace orrery::rl_actors
