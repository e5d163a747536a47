#include "actors/rl/trajectory_convert.h"

namespace orrery::rl_actors {

replay::Trajectory ToReplayTrajectory(const rollout::Trajectory& t) {
  replay::Trajectory r;
  r.task_id = t.task_id;
  r.env_name = t.env_name;
  r.group_id = t.group_id;
  r.seed = t.seed;
  r.status = static_cast<replay::TrajectoryStatus>(t.status);
  r.tokens = t.tokens;
  r.logprobs = t.logprobs;
  r.policy_versions.assign(t.policy_versions.begin(), t.policy_versions.end());
  r.loss_mask.assign(t.loss_mask.begin(), t.loss_mask.end());
  for (rollout::TokenRole role : t.roles) r.roles.push_back(static_cast<replay::TokenRole>(role));
  r.turns = t.turns;
  r.routed_experts = t.routed_experts;
  r.moe_layers = static_cast<uint16_t>(t.moe_layers);
  r.top_k = static_cast<uint16_t>(t.top_k);
  for (const rollout::ToolCallRecord& c : t.tool_calls) {
    r.tool_calls.push_back({c.name, c.arguments_json, c.result, c.latency_ms, c.error, c.turn});
  }
  r.reward = t.reward;
  for (const auto& [name, value] : t.reward_components)
    r.reward_components.emplace_back(name, value);
  if (t.format_error) r.reward_components.emplace_back("format_error", 1.0);
  r.timings = {t.start_unix_seconds, t.generation_seconds, t.tool_seconds, t.reward_seconds,
               t.total_seconds};
  return r;
}

StatusOr<rl::PolicySample> ToPolicySample(const replay::Trajectory& t) {
  ORRERY_RETURN_IF_ERROR(replay::ValidateTrajectory(t));
  rl::PolicySample s;
  s.tokens = t.tokens;
  s.behaviour_logprobs = t.logprobs;
  s.policy_versions.assign(t.policy_versions.begin(), t.policy_versions.end());
  s.loss_mask.assign(t.loss_mask.begin(), t.loss_mask.end());
  s.routed_experts = t.routed_experts;
  s.reward = t.reward;
  s.env_fault = t.status == replay::TrajectoryStatus::kToolError ||
                t.status == replay::TrajectoryStatus::kSandboxTimeout ||
                t.status == replay::TrajectoryStatus::kEnvLost;
  return s;
}

StatusOr<rl::PolicyGroup> DecodeGroup(uint64_t group_id, const std::vector<std::string>& encoded) {
  rl::PolicyGroup g;
  g.group_id = group_id;
  for (const std::string& bytes : encoded) {
    ORRERY_ASSIGN_OR_RETURN(replay::Trajectory t, replay::DecodeTrajectory(bytes));
    ORRERY_ASSIGN_OR_RETURN(rl::PolicySample s, ToPolicySample(t));
    g.samples.push_back(std::move(s));
  }
  return g;
}

}  // namespace orrery::rl_actors
