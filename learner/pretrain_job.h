// One pretraining job from a config: opens the token shards and tokenizer, builds the model, runs
// the Pretrainer through every stage (see learner/pretrainer.h) and prints the header line and the
// per-stage summary table. What `orrery pretrain` and the pretraining phase of `orrery launch` run.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "learner/pretrain_config.h"
#include "learner/pretrainer.h"

namespace orrery {

struct PretrainJobOptions {
  PretrainConfig config;
  std::string run_dir;     // checkpoints and metrics.jsonl go here
  int64_t max_steps = -1;  // -1: every stage's budget
  bool resume = false;     // continue from the newest checkpoint in run_dir
  std::function<void(const MetricRecord&)> on_metric;  // PretrainerOptions::on_metric
};

StatusOr<PretrainSummary> RunPretrainJob(const PretrainJobOptions& options);

}  // namespace orrery
