#include "actors/rl/commands.h"

#include <cstdio>

#include "actors/rl/policy_eval.h"
#include "actors/rl/rl_config.h"
#include "actors/rl/rl_roles.h"
#include "core/run_config.h"
#include "core/safetensors.h"
#include "env/registry.h"
#include "learner/policy_checkpoint.h"

namespace orrery::rl_actors {
namespace {

int EvalCommand(const ConfigSections* sections, const CliArgs& args) {
  const std::string config_path = args.Get("config");
  StatusOr<ConfigDocument> doc = ConfigDocument::ParseFile(config_path);
  if (!doc.ok()) return ReportError(doc.status());
  if (Status s = sections->Validate(*doc); !s.ok()) return ReportError(s);
  StatusOr<ConfigDocument> reread = ConfigDocument::ParseFile(config_path);
  if (!reread.ok()) return ReportError(reread.status());
  ConfigTable root = reread->root();
  const RlConfig rl = ReadRlConfig(root);
  env::EnvRegistry registry;
  env::RegisterBuiltinEnvs(registry);
  StatusOr<std::unique_ptr<env::Env>> env =
      env::CreateEnvFromConfig(root, registry, RolloutEnvDemand(rl));
  if (!env.ok()) return ReportError(env.status().WithContext(config_path));

  const std::string checkpoint = args.Has("checkpoint") ? args.Get("checkpoint") : rl.init;
  if (checkpoint.empty()) {
    return ReportError(
        InvalidArgumentError("rl eval: give --checkpoint or set [rl] init in " + config_path));
  }
  StatusOr<PolicyCheckpoint> policy = LoadPolicyCheckpoint(checkpoint);
  if (!policy.ok()) return ReportError(policy.status());

  PolicyEvalOptions o;
  const RunConfig run = ReadRunConfig(root);
  o.device = run.device;
  o.dtype = run.dtype;
  if (args.Has("device")) {
    const std::string device = args.Get("device");
    if (device != "cpu" && device != "cuda") {
      return ReportError(InvalidArgumentError("--device " + device + ": expected cpu or cuda"));
    }
    o.device = device == "cuda" ? RunDevice::kCuda : RunDevice::kCpu;
  }
  o.tasks = static_cast<int>(args.Int("tasks", rl.eval_tasks));
  o.slots = rl.slots;
  o.agent = rl.agent;
  o.agent.sampling.temperature = args.Float("temperature", rl.eval_temperature);
  const std::string split = args.Get("split", "test");
  StatusOr<env::Split> parsed = env::ParseSplit(split);
  if (!parsed.ok()) return ReportError(parsed.status().WithContext("--split"));
  o.split = *parsed;
  if (o.tasks < 1 || o.agent.sampling.temperature < 0) {
    return ReportError(InvalidArgumentError("rl eval: --tasks must be >= 1, --temperature >= 0"));
  }
  StatusOr<PolicyEvalResult> r = EvaluatePolicy(*policy->model, *policy->format, **env, o);
  if (!r.ok()) return ReportError(r.status());
  std::printf(
      "%s: %d/%d passed (%.1f%%), mean reward %.3f, tool calls in %.0f%% of episodes, "
      "format errors %.0f%%, %.1f generated tokens per episode, %.1f s\n",
      policy->path.c_str(), r->passed, r->episodes, 100.0 * r->pass_rate(), r->mean_reward,
      100.0 * r->tool_call_episode_ratio, 100.0 * r->format_error_ratio, r->mean_generated_tokens,
      r->seconds);
  if (r->families.size() > 1) {
    for (const auto& [name, f] : r->families) {
      std::printf("  %-13s %d/%d passed (%.1f%%), tool calls in %d episodes\n", name.c_str(),
                  f.passed, f.episodes, 100.0 * f.pass_rate(), f.with_tools);
    }
  }
  if (args.Has("json")) {
    if (Status s = WriteFileAtomic(args.Get("json"), r->ToJson() + "\n"); !s.ok()) {
      return ReportError(s);
    }
  }
  return 0;
}

}  // namespace

void RegisterRlCommands(CliRegistry& registry) {
  registry.config_sections().Add("rl", ValidateRlSection);
  RegisterActorRole({"rollout",
                     "RL rollouts: the agent loop on the newest policy, into the replay store",
                     RolloutMain});
  RegisterActorRole({"learner", "RL learner rank: samples groups, updates and publishes the policy",
                     LearnerMain});

  registry.AddGroup({"rl"}, "Agentic RL: evaluate policies (the RL fleet runs under `launch`)");
  const ConfigSections* sections = &registry.config_sections();
  registry.Add(CliCommand{
      {"rl", "eval"},
      "Pass rate of a checkpoint on the test tasks of the config's [env], with [rl] limits",
      {{"--config", "TOML file with [env] and [rl] sections", CliKind::kString, true, ""},
       {"--checkpoint", "checkpoint or run directory (default: [rl] init)", CliKind::kString, false,
        ""},
       {"--tasks", "number of tasks (default: [rl] eval_tasks)", CliKind::kInt, false, ""},
       {"--temperature", "sampling temperature (0: greedy; default [rl] eval_temperature)",
        CliKind::kFloat, false, ""},
       {"--split", "train or test", CliKind::kString, false, "test"},
       {"--json", "also write the result as JSON to this file", CliKind::kString, false, ""},
       {"--device", "cpu or cuda (default: the config's [run] device)", CliKind::kString, false,
        ""}},
      [sections](const CliArgs& args) { return EvalCommand(sections, args); }});
}

}  // namespace orrery::rl_actors
