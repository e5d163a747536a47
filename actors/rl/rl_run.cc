#include "actors/rl/rl_run.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "core/safetensors.h"

namespace orrery::rl_actors {

RlRunPaths::RlRunPaths(const std::string& run_dir)
    : root(run_dir + "/rl"),
      launch_json(root + "/launch.json"),
      weights(root + "/weights"),
      checkpoints(root + "/checkpoints"),
      gloo(root + "/gloo"),
      eval_before(root + "/eval_before.json"),
      eval_after(root + "/eval_after.json") {}

Status WriteLaunchManifest(const RlRunPaths& paths, const RlLaunchManifest& manifest) {
  std::error_code ec;
  std::filesystem::create_directories(paths.root, ec);
  if (ec) return InternalError(paths.root + ": " + ec.message());
  nlohmann::json j;
  j["init"] = manifest.init;
  j["sync"] = manifest.sync;
  j["steps"] = manifest.steps;
  return WriteFileAtomic(paths.launch_json, j.dump(2) + "\n");
}

StatusOr<RlLaunchManifest> ReadLaunchManifest(const RlRunPaths& paths) {
  ORRERY_ASSIGN_OR_RETURN(std::string text, ReadFileToString(paths.launch_json));
  RlLaunchManifest m;
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    m.init = j.at("init").get<std::string>();
    m.sync = j.at("sync").get<bool>();
    m.steps = j.at("steps").get<int64_t>();
  } catch (const std::exception& e) {
    return DataLossError(paths.launch_json + ": " + e.what());
  }
  return m;
}

StatusOr<RlConfig> ResolveRlConfig(const RlConfig& config, const RlRunPaths& paths) {
  RlConfig c = config;
  StatusOr<RlLaunchManifest> m = ReadLaunchManifest(paths);
  if (m.ok()) {
    c.init = m->init;
    c.sync = m->sync;
    c.steps = m->steps;
  } else if (m.status().code() != StatusCode::kNotFound) {
    return m.status();
  }
  // Sync mode alternates one round of generation (groups_per_step groups at version v) with one
  // update: the learner trains on exactly that round, so it cannot replace no-signal groups by
  // further samples (the rollouts wait for v + 1). Such groups just carry no gradient.
  if (c.sync) c.trainer.skip_uniform_groups = false;
  if (c.init.empty()) {
    return InvalidArgumentError(
        "rl.init: no initial policy (set [rl] init to a checkpoint or pretraining run directory)");
  }
  return c;
}

std::string ActorMetricsFile(const std::string& run_dir, const std::string& role, int index) {
  return run_dir + "/" + role + "-" + std::to_string(index) + "/metrics.jsonl";
}

}  // namespace orrery::rl_actors
