// The RL actors' metric records, named as docs/dashboard.md lists them (the contract with the
// dashboard and Prometheus): reward and rollout series from finished groups, learner and routing
// series from an update.
#pragma once

#include <string>
#include <vector>

#include "core/metrics.h"
#include "learner/rl/rl_trainer.h"
#include "model/model.h"
#include "rollout/agent_loop.h"

namespace orrery::rl_actors {

// reward/* (overall and per environment) and rollout/* over `groups` (episodes ended by an
// environment fault count only in rollout/env_fault_ratio); `generation_seconds` is the
// engine time that produced them (for rollout/generation_tokens_per_second; <= 0 leaves it out).
MetricRecord RolloutRecord(const std::string& source, int64_t step,
                           const std::vector<rollout::TrajectoryGroup>& groups,
                           int64_t generated_tokens, double generation_seconds);

// The learner's side of publishing a version, by phase (learner/weight_sync_seconds/phase/*):
// shared_snapshot, the copy into the shared buffer (weights = "shared", 0 otherwise); host_copy,
// the GPU model's masters into the host model (0 on the CPU); snapshot and write, the file.
struct WeightSyncTimes {
  double shared_snapshot_seconds = 0, host_copy_seconds = 0, snapshot_seconds = 0,
         write_seconds = 0;
};

// learner/* and routing/* of one update. `model` supplies the Quantile Balancing biases.
MetricRecord LearnerRecord(const std::string& source, const rl::RlStepStats& stats,
                           model::Model& model, int64_t tokens_total, int64_t max_staleness,
                           const WeightSyncTimes& sync);

}  // namespace orrery::rl_actors
