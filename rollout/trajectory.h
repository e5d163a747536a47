// A token-exact trajectory (spec/rl.md §3): exactly the ids the engine fed and produced, so the
// learner never re-tokenises text. actors/rl converts it to the Cap'n Proto Trajectory of
// actors/schema/trajectory.capnp for the replay store.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace orrery::rollout {

enum class TokenRole : uint8_t { kPrompt = 0, kModel = 1, kTool = 2 };
// The order of schema::TrajectoryStatus. The last three are environment faults (env/env.h): the
// environment, not the policy, ended the episode.
enum class EpisodeStatus : uint8_t {
  kFinished = 0,
  kTruncated = 1,
  kToolError = 2,  // an environment call failed
  kTimeout = 3,    // an environment call passed its deadline
  kEnvLost = 4,    // the env worker holding the episode is gone (restarted, unreachable)
};
const char* EpisodeStatusName(EpisodeStatus status);

struct ToolCallRecord {
  std::string name;
  std::string arguments_json;
  std::string result;
  double latency_ms = 0;
  std::string error;  // empty when the call succeeded
  uint32_t turn = 0;
};

struct Trajectory {
  std::string task_id;
  std::string env_name;
  uint64_t group_id = 0;
  uint64_t seed = 0;
  EpisodeStatus status = EpisodeStatus::kFinished;
  bool format_error = false;  // the last assistant turn did not parse

  // Per token, all of the same length.
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;           // behaviour log μ(token | prefix); 0 for prompt and tool
  std::vector<int64_t> policy_versions;  // version that produced (model) or fed (others) it
  std::vector<uint8_t> loss_mask;        // 1 on model tokens
  std::vector<TokenRole> roles;
  std::vector<uint16_t> turns;
  // R3: row-major [tokens x moe_layers x top_k], the experts the rollout routed each token to
  // when it was fed. A final sampled token that was never fed gets experts 0..top_k-1: its output
  // predicts nothing, so the choice cannot change any loss term.
  std::vector<uint16_t> routed_experts;
  int moe_layers = 0;
  int top_k = 0;

  std::vector<ToolCallRecord> tool_calls;
  double reward = 0;
  std::map<std::string, double> reward_components;
  double start_unix_seconds = 0, generation_seconds = 0, tool_seconds = 0, reward_seconds = 0,
         total_seconds = 0;

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  // Ended by an environment fault: not the policy's doing, so never trained on (reward unknown).
  bool env_fault() const {
    return status == EpisodeStatus::kToolError || status == EpisodeStatus::kTimeout ||
           status == EpisodeStatus::kEnvLost;
  }
  int64_t model_tokens() const;
  int64_t min_policy_version() const;  // over model tokens (0 when there are none)
};

}  // namespace orrery::rollout
