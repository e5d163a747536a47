#include "actors/launch/run_phases.h"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "actors/rl/rl_config.h"
#include "actors/rl/rl_run.h"
#include "core/file_io.h"
#include "core/logging.h"
#include "core/safetensors.h"
#include "env/registry.h"
#include "learner/checkpoint.h"
#include "learner/policy_checkpoint.h"
#include "learner/pretrain_job.h"

namespace orrery {
namespace {

std::string Absolute(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(path, ec);
  return ec ? path : p.lexically_normal().string();
}

StatusOr<rl_actors::PolicyEvalResult> ReadEvalJson(const std::string& path) {
  ORRERY_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  StatusOr<rl_actors::PolicyEvalResult> r = rl_actors::PolicyEvalResult::FromJson(text);
  if (!r.ok()) return r.status().WithContext(path);
  return r;
}

template <typename R>
std::string Percent(const R& r) {
  char b[64];
  std::snprintf(b, sizeof(b), "%.1f%% (%d/%d)", 100.0 * r.pass_rate(), r.passed, r.episodes);
  return b;
}

// The GPU memory a phase of this process cached (its caching allocator keeps freed blocks) goes
// back to the driver: the fleet's learner and rollouts share the device with this process.
void ReleaseDeviceCache(const RunConfig& run) {
  if (run.device == RunDevice::kCuda) ReleaseCachedDeviceMemory(0);
}

}  // namespace

StatusOr<RunPhases> RunPhases::Load(const RunPhaseOptions& options) {
  RunPhases p;
  p.options_ = options;
  ORRERY_ASSIGN_OR_RETURN(ConfigDocument doc,
                          ConfigDocument::ParseFile(options.config_path, options.config_dir));
  p.pretrain_ = doc.HasTopLevel("pretrain");
  p.rl_ = doc.HasTopLevel("rl");
  if (p.rl_) {
    ConfigTable root = doc.root();
    p.rl_config_ = rl_actors::ReadRlConfig(root);
    const std::string& init = p.rl_config_.init;
    p.init_ = !init.empty() ? init : (p.pretrain_ ? options.run.dir + "/pretrain" : std::string());
    if (p.init_.empty()) {
      return InvalidArgumentError(options.config_path +
                                  ": [rl] init is not set and the config does not pretrain: "
                                  "expected the initial policy's checkpoint or run directory");
    }
    p.init_ = Absolute(p.init_);
  }
  return p;
}

Status RunPhases::BeforeFleet(const std::function<void(const MetricRecord&)>& on_metric) {
  const std::string run_dir = options_.run.dir;
  if (pretrain_) {
    ORRERY_ASSIGN_OR_RETURN(ConfigDocument doc,
                            ConfigDocument::ParseFile(options_.config_path, options_.config_dir));
    ConfigTable root = doc.root();
    PretrainJobOptions job;
    job.config = ReadPretrainConfig(root);
    job.run_dir = run_dir + "/pretrain";
    job.resume = LatestCheckpoint(job.run_dir + "/checkpoints").ok();
    job.on_metric = on_metric;
    std::printf("== pretraining phase: %s%s\n", job.run_dir.c_str(),
                job.resume ? " (resuming)" : "");
    std::fflush(stdout);
    const auto start = std::chrono::steady_clock::now();
    ORRERY_ASSIGN_OR_RETURN(PretrainSummary summary, RunPretrainJob(job));
    ReleaseDeviceCache(options_.run);
    pretrain_seconds_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!summary.finished)
      return FailedPreconditionError("pretraining stopped before its last stage ended");
  }
  if (!rl_) return Status::OK();

  const rl_actors::RlConfig& rl = rl_config_;
  const rl_actors::RlRunPaths paths(run_dir);
  // Every actor starts from it: a missing or incomplete checkpoint fails here, in one line,
  // rather than in each actor's restarts.
  if (StatusOr<std::string> dir = ResolveCheckpointDir(init_); !dir.ok()) {
    return dir.status().WithContext(options_.config_path + ": rl.init");
  }
  // A re-launch keeps the initial score only when it scored the same initial policy.
  if (StatusOr<rl_actors::RlLaunchManifest> earlier = rl_actors::ReadLaunchManifest(paths);
      earlier.ok() && earlier->init != init_) {
    std::error_code ec;
    std::filesystem::remove(paths.eval_before, ec);
  }
  rl_actors::RlLaunchManifest manifest;
  manifest.init = init_;
  manifest.sync = rl.sync || options_.sync;
  manifest.steps = rl.steps;
  ORRERY_RETURN_IF_ERROR(rl_actors::WriteLaunchManifest(paths, manifest));

  StatusOr<rl_actors::PolicyEvalResult> before = ReadEvalJson(paths.eval_before);
  if (!before.ok()) {
    std::printf("== RL phase: scoring the initial policy %s on %d test tasks\n", init_.c_str(),
                rl.eval_tasks);
    std::fflush(stdout);
    before = Evaluate(init_, paths.eval_before);
    if (!before.ok()) return before.status();
    eval_before_seconds_ = before->seconds;
  }
  before_ = *before;
  std::printf("== RL phase: initial pass rate %s; %lld updates of %d groups x %d (%s)\n",
              Percent(before_).c_str(), static_cast<long long>(rl.steps), rl.groups_per_step,
              rl.group_size, manifest.sync ? "sync" : "async");
  std::fflush(stdout);
  rl_start_ = std::chrono::steady_clock::now();
  return Status::OK();
}

StatusOr<rl_actors::PolicyEvalResult> RunPhases::Evaluate(const std::string& checkpoint,
                                                          const std::string& json_path) {
  ORRERY_ASSIGN_OR_RETURN(ConfigDocument doc,
                          ConfigDocument::ParseFile(options_.config_path, options_.config_dir));
  ConfigTable root = doc.root();  // [env]
  const rl_actors::RlConfig& rl = rl_config_;
  env::EnvRegistry registry;
  env::RegisterBuiltinEnvs(registry);
  ORRERY_ASSIGN_OR_RETURN(
      std::unique_ptr<env::Env> env,
      env::CreateEnvFromConfig(root, registry, rl_actors::RolloutEnvDemand(rl)));
  ORRERY_ASSIGN_OR_RETURN(PolicyCheckpoint policy, LoadPolicyCheckpoint(checkpoint));
  rl_actors::PolicyEvalOptions o;
  o.tasks = rl.eval_tasks;
  o.slots = rl.slots;
  o.agent = rl.agent;
  o.agent.sampling.temperature = rl.eval_temperature;
  o.device = options_.run.device;
  o.dtype = options_.run.dtype;
  ORRERY_ASSIGN_OR_RETURN(rl_actors::PolicyEvalResult r,
                          rl_actors::EvaluatePolicy(*policy.model, *policy.format, *env, o));
  ReleaseDeviceCache(options_.run);
  ORRERY_RETURN_IF_ERROR(WriteFileAtomic(json_path, r.ToJson() + "\n"));
  return r;
}

Status RunPhases::AfterFleet(const std::string& dashboard_url) {
  const rl_actors::RlRunPaths paths(options_.run.dir);
  const double rl_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - rl_start_).count();
  ORRERY_ASSIGN_OR_RETURN(std::string final_checkpoint, LatestCheckpoint(paths.checkpoints));
  std::printf("== RL phase done: scoring the final policy %s\n", final_checkpoint.c_str());
  std::fflush(stdout);
  ORRERY_ASSIGN_OR_RETURN(rl_actors::PolicyEvalResult after,
                          Evaluate(final_checkpoint, paths.eval_after));
  std::printf("\nrun summary (%s)\n", options_.run.name.c_str());
  std::printf("  wall time       ");
  if (pretrain_) std::printf("pretraining %.0f s, ", pretrain_seconds_);
  std::printf("initial score %.0f s, RL phase %.0f s, final score %.0f s (this launch)\n",
              eval_before_seconds_, rl_seconds, after.seconds);
  std::printf("  pass rate       before %s -> after %s  (%+.1f points)\n", Percent(before_).c_str(),
              Percent(after).c_str(), 100.0 * (after.pass_rate() - before_.pass_rate()));
  if (after.families.size() > 1 || before_.families.size() > 1) {
    std::map<std::string, int> names;
    for (const auto& [name, f] : before_.families) names[name] = 0;
    for (const auto& [name, f] : after.families) names[name] = 0;
    for (const auto& [name, unused] : names) {
      const rl_actors::FamilyEvalResult b =
          before_.families.count(name) ? before_.families.at(name) : rl_actors::FamilyEvalResult();
      const rl_actors::FamilyEvalResult a =
          after.families.count(name) ? after.families.at(name) : rl_actors::FamilyEvalResult();
      std::printf("    %-13s before %s -> after %s  (%+.1f points)\n", name.c_str(),
                  Percent(b).c_str(), Percent(a).c_str(), 100.0 * (a.pass_rate() - b.pass_rate()));
    }
  }
  std::printf("  tool use        before %.0f%% -> after %.0f%% of episodes\n",
              100.0 * before_.tool_call_episode_ratio, 100.0 * after.tool_call_episode_ratio);
  std::printf("  run directory   %s\n", Absolute(options_.run.dir).c_str());
  std::printf("  final policy    %s\n", final_checkpoint.c_str());
  if (!dashboard_url.empty()) std::printf("  dashboard       %s\n", dashboard_url.c_str());
  std::fflush(stdout);
  // The same, for scripts (scripts/gpu_demo.sh): RUN/summary.json.
  nlohmann::json j;
  j["name"] = options_.run.name;
  j["seconds"] = {{"pretrain", pretrain_seconds_},
                  {"eval_before", eval_before_seconds_},
                  {"rl", rl_seconds},
                  {"eval_after", after.seconds}};
  j["updates"] = rl_config_.steps;
  j["sync"] = rl_config_.sync || options_.sync;
  j["before"] = nlohmann::json::parse(before_.ToJson());
  j["after"] = nlohmann::json::parse(after.ToJson());
  j["final_policy"] = final_checkpoint;
  ORRERY_RETURN_IF_ERROR(WriteFileAtomic(options_.run.dir + "/summary.json", j.dump(2) + "\n"));
  return Status::OK();
}

}  // namespace orrery
