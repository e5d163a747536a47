// Scores a policy on an environment's held-out tasks: the "pass rate before and after" of an RL
// run, and `orrery rl eval`.
//
// Tasks 0..tasks-1 of `split` run as groups of one episode through the same agent loop the
// rollout actors use (continuous batching over `slots`), so evaluation and training see exactly
// the same prompts, tool protocol and limits. An episode passes when the environment's "correct"
// reward component is at least 0.5 (or, without that component, when its reward is at least 1).
// Pass rates are also counted per task family (env::Env::Family: "calc/d2", ...).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/run_config.h"
#include "env/env.h"
#include "model/chat_format.h"
#include "model/model.h"
#include "rollout/agent_loop.h"

namespace orrery::rl_actors {

struct PolicyEvalOptions {
  env::Split split = env::Split::kTest;
  int tasks = 50;
  int slots = 16;
  rollout::AgentOptions agent;  // sampling.temperature 0: greedy
  // [run] device and dtype: the host model itself, or its upload to CUDA device 0.
  RunDevice device = RunDevice::kCpu;
  DType dtype = DType::kBF16;
};

struct FamilyEvalResult {
  int episodes = 0;
  int passed = 0;
  int with_tools = 0;  // episodes with at least one tool call
  double pass_rate() const { return episodes > 0 ? static_cast<double>(passed) / episodes : 0.0; }
};

struct PolicyEvalResult {
  int episodes = 0;
  int passed = 0;
  std::map<std::string, FamilyEvalResult> families;
  double mean_reward = 0;
  double tool_call_episode_ratio = 0;  // episodes with at least one tool call
  double format_error_ratio = 0;
  double mean_generated_tokens = 0;
  double seconds = 0;
  double pass_rate() const { return episodes > 0 ? static_cast<double>(passed) / episodes : 0.0; }
  std::string ToJson() const;
  // ToJson's text back ("families" may be absent: files written before families were counted).
  static StatusOr<PolicyEvalResult> FromJson(const std::string& text);
};

// True when the trajectory counts as a pass (see above).
bool EpisodePassed(const rollout::Trajectory& t);

// `model` is used in place on the CPU, or uploaded to the GPU (the decode state is created here
// and released on return).
StatusOr<PolicyEvalResult> EvaluatePolicy(model::Model& model, const ChatFormat& format,
                                          env::Env& env, const PolicyEvalOptions& options);

}  // namespace orrery::rl_actors
