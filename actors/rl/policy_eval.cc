#include "actors/rl/policy_eval.h"

#include <chrono>
#include <nlohmann/json.hpp>

#include "rollout/make_backend.h"

namespace orrery::rl_actors {

bool EpisodePassed(const rollout::Trajectory& t) {
  auto it = t.reward_components.find("correct");
  if (it != t.reward_components.end()) return it->second >= 0.5;
  return t.reward >= 1.0;
}

std::string PolicyEvalResult::ToJson() const {
  nlohmann::json j;
  j["episodes"] = episodes;
  j["passed"] = passed;
  j["pass_rate"] = pass_rate();
  j["mean_reward"] = mean_reward;
  j["tool_call_episode_ratio"] = tool_call_episode_ratio;
  j["format_error_ratio"] = format_error_ratio;
  j["mean_generated_tokens"] = mean_generated_tokens;
  j["seconds"] = seconds;
  nlohmann::json f = nlohmann::json::object();
  for (const auto& [name, r] : families) {
    f[name] = {{"episodes", r.episodes},
               {"passed", r.passed},
               {"with_tools", r.with_tools},
               {"pass_rate", r.pass_rate()}};
  }
  j["families"] = f;
  return j.dump();
}

StatusOr<PolicyEvalResult> PolicyEvalResult::FromJson(const std::string& text) {
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    PolicyEvalResult r;
    r.episodes = j.at("episodes").get<int>();
    r.passed = j.at("passed").get<int>();
    r.mean_reward = j.at("mean_reward").get<double>();
    r.tool_call_episode_ratio = j.at("tool_call_episode_ratio").get<double>();
    r.format_error_ratio = j.at("format_error_ratio").get<double>();
    r.mean_generated_tokens = j.at("mean_generated_tokens").get<double>();
    r.seconds = j.at("seconds").get<double>();
    if (j.contains("families")) {
      for (const auto& [name, f] : j.at("families").items()) {
        FamilyEvalResult& fr = r.families[name];
        fr.episodes = f.at("episodes").get<int>();
        fr.passed = f.at("passed").get<int>();
        fr.with_tools = f.at("with_tools").get<int>();
      }
    }
    return r;
  } catch (const std::exception& e) {
    return DataLossError(std::string("policy evaluation result: ") + e.what());
  }
}

StatusOr<PolicyEvalResult> EvaluatePolicy(model::Model& model, const ChatFormat& format,
                                          env::Env& env, const PolicyEvalOptions& options) {
  if (options.tasks < 0 || options.slots < 1) {
    return InvalidArgumentError("policy evaluation: expected tasks >= 0 and slots >= 1");
  }
  ORRERY_RETURN_IF_ERROR(rollout::ValidateAgentOptions(options.agent));
  const auto start = std::chrono::steady_clock::now();
  StatusOr<std::unique_ptr<rollout::PolicyBackend>> made = rollout::MakePolicyBackend(
      &model, options.device, options.dtype, options.slots, options.agent.max_episode_tokens);
  if (!made.ok()) {
    return options.device == RunDevice::kCuda ? made.status().WithContext("run.device = \"cuda\"")
                                              : made.status();
  }
  std::unique_ptr<rollout::PolicyBackend> backend = std::move(made).value();
  rollout::AgentLoop loop(backend.get(), &format, &env, options.agent);
  std::map<uint64_t, std::string> family_of;  // group id (the task index) -> family
  for (int i = 0; i < options.tasks; ++i) {
    ORRERY_ASSIGN_OR_RETURN(env::TaskRef task, env.Task(options.split, static_cast<uint64_t>(i)));
    family_of[static_cast<uint64_t>(i)] = env.Family(task);
    loop.AddGroup(task, static_cast<uint64_t>(i), 1);
  }
  ORRERY_ASSIGN_OR_RETURN(std::vector<rollout::TrajectoryGroup> groups, loop.RunUntilIdle());
  PolicyEvalResult r;
  int64_t generated = 0;
  int with_tools = 0, format_errors = 0;
  for (const rollout::TrajectoryGroup& g : groups) {
    FamilyEvalResult& family = r.families[family_of[g.group_id]];
    for (const rollout::Trajectory& t : g.trajectories) {
      ++r.episodes;
      ++family.episodes;
      family.passed += EpisodePassed(t) ? 1 : 0;
      family.with_tools += t.tool_calls.empty() ? 0 : 1;
      r.passed += EpisodePassed(t) ? 1 : 0;
      r.mean_reward += t.reward;
      generated += t.model_tokens();
      with_tools += t.tool_calls.empty() ? 0 : 1;
      format_errors += t.format_error ? 1 : 0;
    }
  }
  if (r.episodes > 0) {
    r.mean_reward /= r.episodes;
    r.tool_call_episode_ratio = static_cast<double>(with_tools) / r.episodes;
    r.format_error_ratio = static_cast<double>(format_errors) / r.episodes;
    r.mean_generated_tokens = static_cast<double>(generated) / r.episodes;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace orrery::rl_actors
