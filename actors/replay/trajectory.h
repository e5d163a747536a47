// Token-exact trajectories (actors/schema/trajectory.capnp, spec rl.md §3) as plain C++ values,
// their byte encoding for the replay store, and the replay item of a group.
//
//   Trajectory t;  t.tokens = {...};  t.logprobs = {...};  ...
//   ORRERY_RETURN_IF_ERROR(ValidateTrajectory(t));
//   ItemInput item = GroupItem({t0, t1, ...}, /*priority=*/1.0);   // one GRPO group
//   client->Insert("grpo", item);
//   ... sampled.trajectories[i] -> DecodeTrajectory(bytes)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "actors/replay/table.h"
#include "core/status.h"

namespace orrery::replay {

enum class TokenRole : uint8_t { kPrompt = 0, kModel = 1, kTool = 2 };
enum class TrajectoryStatus : uint8_t {
  kFinished = 0,
  kTruncated = 1,
  kToolError = 2,
  kSandboxTimeout = 3,
  kEnvLost = 4,
};

struct ToolCallRecord {
  std::string name;
  std::string arguments_json;
  std::string result;
  double latency_ms = 0;
  std::string error;  // empty on success
  uint32_t turn = 0;
};

struct TrajectoryTimings {
  double start_unix_seconds = 0;
  double generation_seconds = 0;
  double tool_seconds = 0;
  double reward_seconds = 0;
  double total_seconds = 0;
};

struct Trajectory {
  std::string task_id;
  std::string env_name;
  uint64_t group_id = 0;
  uint64_t seed = 0;
  TrajectoryStatus status = TrajectoryStatus::kFinished;
  // Per token, all of the same length.
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<uint64_t> policy_versions;
  std::vector<bool> loss_mask;
  std::vector<TokenRole> roles;
  std::vector<uint16_t> turns;
  // R3: [tokens x moe_layers x top_k] row-major, or empty.
  std::vector<uint16_t> routed_experts;
  uint16_t moe_layers = 0;
  uint16_t top_k = 0;
  std::vector<ToolCallRecord> tool_calls;
  double reward = 0;
  std::vector<std::pair<std::string, double>> reward_components;
  TrajectoryTimings timings;
};

// InvalidArgument when per-token columns differ in length or routed_experts has the wrong size.
Status ValidateTrajectory(const Trajectory& t);
// Cap'n Proto bytes (flat encoding; the store compresses on disk).
std::string EncodeTrajectory(const Trajectory& t);
StatusOr<Trajectory> DecodeTrajectory(std::string_view bytes);
// The oldest policy version of any model token (the staleness window's measure); 0 when none.
uint64_t MinPolicyVersion(const Trajectory& t);
// One replay item for a group: encoded trajectories, tokens = total token count, the group's
// oldest policy version, the first trajectory's group id.
ItemInput GroupItem(const std::vector<Trajectory>& group, double priority);

}  // namespace orrery::replay
