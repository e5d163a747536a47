// The RL phase's files in a run directory, and the launch manifest that tells every RL actor what
// the launcher decided.
//
//   RUN/rl/launch.json         {"init": <policy checkpoint>, "sync": bool, "steps": N}: written by
//                              `orrery launch` before the fleet starts (the resolved [rl] init,
//                              --sync); actors started by hand without it use [rl] as written
//   RUN/rl/weights/            published policy versions (learner/rl/weight_store.h)
//   RUN/rl/checkpoints/        learner checkpoints (weights, AdamW, version)
//   RUN/rl/gloo/               learner-rank rendezvous (FileStore) and the generation file
//   RUN/rl/eval_before.json, eval_after.json   the launcher's pass-rate evaluations
//   RUN/<role>-<index>/metrics.jsonl           each RL actor's metric records
#pragma once

#include <string>

#include "actors/rl/rl_config.h"
#include "core/status.h"

namespace orrery::rl_actors {

struct RlRunPaths {
  explicit RlRunPaths(const std::string& run_dir);
  std::string root, launch_json, weights, checkpoints, gloo, eval_before, eval_after;
};

struct RlLaunchManifest {
  std::string init;  // absolute
  bool sync = false;
  int64_t steps = 0;
};

Status WriteLaunchManifest(const RlRunPaths& paths, const RlLaunchManifest& manifest);
// NotFound when the launcher wrote none.
StatusOr<RlLaunchManifest> ReadLaunchManifest(const RlRunPaths& paths);

// `config` with the manifest's decisions applied (when there is one). Fails when neither names an
// initial policy.
StatusOr<RlConfig> ResolveRlConfig(const RlConfig& config, const RlRunPaths& paths);

// The file an RL actor appends its metric records to: RUN/<role>-<index>/metrics.jsonl.
std::string ActorMetricsFile(const std::string& run_dir, const std::string& role, int index);

}  // namespace orrery::rl_actors
