// The phases `orrery launch CONFIG` runs around its fleet when the config asks for them:
//
//   1. pretraining ([pretrain], [optimizer], [[stages]]): the staged curriculum into
//      RUN/pretrain, resumed from its newest checkpoint when the run directory already has one
//      (a finished pretraining is not repeated);
//   2. the RL phase ([rl] with "rollout" and "learner" roles in [fleet]): the initial policy is
//      [rl] init, or RUN/pretrain when the config pretrains; the launcher writes RUN/rl/launch.json
//      for the actors, scores the initial policy on the test tasks (RUN/rl/eval_before.json, kept
//      across re-launches), runs the fleet until the learner announces the last version
//      (phase "rl-done"), scores the final policy (RUN/rl/eval_after.json) and prints a summary:
//      wall time by phase, pass rate before and after (per task family when there are several),
//      tool use; the same as RUN/summary.json.
// Without these sections the launcher only runs the fleet until Ctrl-C.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "actors/rl/policy_eval.h"
#include "actors/rl/rl_config.h"
#include "core/config.h"
#include "core/metrics.h"
#include "core/run_config.h"

namespace orrery {

struct RunPhaseOptions {
  std::string config_path;
  std::string config_dir;  // "" : the config file's directory
  RunConfig run;
  bool sync = false;  // --sync: rollouts wait for every update
};

class RunPhases {
 public:
  // Reads the config's phase sections (the caller validated the whole file).
  static StatusOr<RunPhases> Load(const RunPhaseOptions& options);

  bool pretrain() const { return pretrain_; }
  bool rl() const { return rl_; }

  // Phases before the fleet: pretraining, the RL manifest, the initial evaluation. `on_metric`
  // (may be empty) also gets every pretraining record, e.g. for the launcher's live dashboard.
  Status BeforeFleet(const std::function<void(const MetricRecord&)>& on_metric = {});
  // True once the fleet's run state says the RL phase is over (polled by the supervisor loop).
  static bool FleetDone(const std::string& phase) { return phase == "rl-done"; }
  // After the fleet stopped with the RL phase done: the final evaluation and the summary.
  Status AfterFleet(const std::string& dashboard_url);

 private:
  RunPhases() = default;
  StatusOr<rl_actors::PolicyEvalResult> Evaluate(const std::string& checkpoint,
                                                 const std::string& json_path);

  RunPhaseOptions options_;
  bool pretrain_ = false, rl_ = false;
  rl_actors::RlConfig rl_config_;  // [rl] as read at Load
  std::string init_;
  double pretrain_seconds_ = 0;
  double eval_before_seconds_ = 0;  // 0 when the initial score was kept from an earlier launch
  std::chrono::steady_clock::time_point rl_start_;
  rl_actors::PolicyEvalResult before_;
};

}  // namespace orrery
