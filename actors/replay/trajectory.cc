#include "actors/replay/trajectory.h"

#include <capnp/message.h>

#include <algorithm>
#include <limits>

#include "actors/replay/capnp_io.h"
#include "actors/schema/trajectory.capnp.h"

namespace orrery::replay {

Status ValidateTrajectory(const Trajectory& t) {
  const size_t n = t.tokens.size();
  auto check = [&](size_t size, const char* what) -> Status {
    if (size != n) {
      return InvalidArgumentError("trajectory '" + t.task_id + "': " + what + " has " +
                                  std::to_string(size) + " entries for " + std::to_string(n) +
                                  " tokens");
    }
    return Status::OK();
  };
  ORRERY_RETURN_IF_ERROR(check(t.logprobs.size(), "logprobs"));
  ORRERY_RETURN_IF_ERROR(check(t.policy_versions.size(), "policy_versions"));
  ORRERY_RETURN_IF_ERROR(check(t.loss_mask.size(), "loss_mask"));
  ORRERY_RETURN_IF_ERROR(check(t.roles.size(), "roles"));
  ORRERY_RETURN_IF_ERROR(check(t.turns.size(), "turns"));
  if (!t.routed_experts.empty() &&
      t.routed_experts.size() != n * t.moe_layers * static_cast<size_t>(t.top_k)) {
    return InvalidArgumentError("trajectory '" + t.task_id + "': routed_experts has " +
                                std::to_string(t.routed_experts.size()) + " entries, expected " +
                                std::to_string(n) + " x " + std::to_string(t.moe_layers) + " x " +
                                std::to_string(t.top_k));
  }
  return Status::OK();
}

std::string EncodeTrajectory(const Trajectory& t) {
  capnp::MallocMessageBuilder builder;
  auto r = builder.initRoot<schema::Trajectory>();
  r.setTaskId(t.task_id);
  r.setEnvName(t.env_name);
  r.setGroupId(t.group_id);
  r.setSeed(t.seed);
  r.setStatus(static_cast<schema::TrajectoryStatus>(t.status));
  const unsigned n = static_cast<unsigned>(t.tokens.size());
  auto tokens = r.initTokens(n);
  for (unsigned i = 0; i < n; ++i) tokens.set(i, t.tokens[i]);
  auto lp = r.initLogprobs(static_cast<unsigned>(t.logprobs.size()));
  for (unsigned i = 0; i < t.logprobs.size(); ++i) lp.set(i, t.logprobs[i]);
  auto pv = r.initPolicyVersions(static_cast<unsigned>(t.policy_versions.size()));
  for (unsigned i = 0; i < t.policy_versions.size(); ++i) pv.set(i, t.policy_versions[i]);
  auto mask = r.initLossMask(static_cast<unsigned>(t.loss_mask.size()));
  for (unsigned i = 0; i < t.loss_mask.size(); ++i) mask.set(i, t.loss_mask[i]);
  auto roles = r.initRoles(static_cast<unsigned>(t.roles.size()));
  for (unsigned i = 0; i < t.roles.size(); ++i) {
    roles.set(i, static_cast<schema::TokenRole>(t.roles[i]));
  }
  auto turns = r.initTurns(static_cast<unsigned>(t.turns.size()));
  for (unsigned i = 0; i < t.turns.size(); ++i) turns.set(i, t.turns[i]);
  auto experts = r.initRoutedExperts(static_cast<unsigned>(t.routed_experts.size()));
  for (unsigned i = 0; i < t.routed_experts.size(); ++i) experts.set(i, t.routed_experts[i]);
  r.setMoeLayers(t.moe_layers);
  r.setTopK(t.top_k);
  auto calls = r.initToolCalls(static_cast<unsigned>(t.tool_calls.size()));
  for (unsigned i = 0; i < t.tool_calls.size(); ++i) {
    const ToolCallRecord& c = t.tool_calls[i];
    calls[i].setName(c.name);
    calls[i].setArgumentsJson(c.arguments_json);
    calls[i].setResult(c.result);
    calls[i].setLatencyMs(c.latency_ms);
    calls[i].setError(c.error);
    calls[i].setTurn(c.turn);
  }
  r.setReward(t.reward);
  auto comps = r.initRewardComponents(static_cast<unsigned>(t.reward_components.size()));
  for (unsigned i = 0; i < t.reward_components.size(); ++i) {
    comps[i].setName(t.reward_components[i].first);
    comps[i].setValue(t.reward_components[i].second);
  }
  auto tm = r.initTimings();
  tm.setStartUnixSeconds(t.timings.start_unix_seconds);
  tm.setGenerationSeconds(t.timings.generation_seconds);
  tm.setToolSeconds(t.timings.tool_seconds);
  tm.setRewardSeconds(t.timings.reward_seconds);
  tm.setTotalSeconds(t.timings.total_seconds);
  return CapnpToBytes(builder);
}

StatusOr<Trajectory> DecodeTrajectory(std::string_view bytes) {
  Trajectory t;
  ORRERY_RETURN_IF_ERROR(ReadCapnpMessage<schema::Trajectory>(
      bytes, "trajectory", [&](schema::Trajectory::Reader r) -> Status {
        t.task_id = r.getTaskId();
        t.env_name = r.getEnvName();
        t.group_id = r.getGroupId();
        t.seed = r.getSeed();
        const auto status = static_cast<uint16_t>(r.getStatus());
        if (status > static_cast<uint16_t>(TrajectoryStatus::kEnvLost))
          return InvalidArgumentError("trajectory: unknown status " + std::to_string(status));
        t.status = static_cast<TrajectoryStatus>(status);
        for (int32_t v : r.getTokens()) t.tokens.push_back(v);
        for (float v : r.getLogprobs()) t.logprobs.push_back(v);
        for (uint64_t v : r.getPolicyVersions()) t.policy_versions.push_back(v);
        for (bool v : r.getLossMask()) t.loss_mask.push_back(v);
        for (auto v : r.getRoles()) {
          if (static_cast<uint16_t>(v) > 2) return InvalidArgumentError("trajectory: unknown role");
          t.roles.push_back(static_cast<TokenRole>(v));
        }
        for (uint16_t v : r.getTurns()) t.turns.push_back(v);
        for (uint16_t v : r.getRoutedExperts()) t.routed_experts.push_back(v);
        t.moe_layers = r.getMoeLayers();
        t.top_k = r.getTopK();
        for (auto c : r.getToolCalls()) {
          t.tool_calls.push_back({c.getName(), c.getArgumentsJson(), c.getResult(),
                                  c.getLatencyMs(), c.getError(), c.getTurn()});
        }
        t.reward = r.getReward();
        for (auto c : r.getRewardComponents()) {
          t.reward_components.emplace_back(c.getName(), c.getValue());
        }
        auto tm = r.getTimings();
        t.timings = {tm.getStartUnixSeconds(), tm.getGenerationSeconds(), tm.getToolSeconds(),
                     tm.getRewardSeconds(), tm.getTotalSeconds()};
        return Status::OK();
      }));
  ORRERY_RETURN_IF_ERROR(ValidateTrajectory(t));
  return t;
}

uint64_t MinPolicyVersion(const Trajectory& t) {
  uint64_t v = std::numeric_limits<uint64_t>::max();
  for (size_t i = 0; i < t.policy_versions.size(); ++i) {
    if (i < t.roles.size() && t.roles[i] != TokenRole::kModel) continue;
    v = std::min(v, t.policy_versions[i]);
  }
  return v == std::numeric_limits<uint64_t>::max() ? 0 : v;
}

ItemInput GroupItem(const std::vector<Trajectory>& group, double priority) {
  ItemInput item;
  item.priority = priority;
  item.group_id = group.empty() ? 0 : group[0].group_id;
  uint64_t min_version = std::numeric_limits<uint64_t>::max();
  for (const Trajectory& t : group) {
    item.tokens += static_cast<int64_t>(t.tokens.size());
    min_version = std::min(min_version, MinPolicyVersion(t));
    item.trajectories.push_back(EncodeTrajectory(t));
  }
  item.min_policy_version = group.empty() ? 0 : static_cast<int64_t>(min_version);
  return item;
}

}  // namespace orrery::replay
