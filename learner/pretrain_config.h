// The pretraining config: [pretrain] (model, data, batch geometry, cadence), [optimizer] (AdamW,
// clipping, schedule) and the staged curriculum [[stages]] (sequence length, token budget,
// optional learning-rate scale). Example: configs/pretrain/tiny.toml; docs/pretraining.md.
//
//   [pretrain]
//   model = "../model/tiny.toml"     # a [model] file (relative to this file)
//   data = "../../runs/demo/data"    # a directory from `orrery data prepare`
//   tokens_per_step = 16384          # tokens per optimizer step, in every stage
//   micro_batch_tokens = 4096        # tokens per forward/backward (gradient accumulation)
//   eval_every = 20                  # steps between held-out evaluations (0: only at stage ends)
//   eval_tokens = 16384              # held-out tokens per evaluation
//   checkpoint_every = 50            # steps between checkpoints (0: only at the end)
//   keep_checkpoints = 3
//
//   [optimizer]
//   lr = 3e-3, beta1, beta2, eps, weight_decay, clip_grad_norm,
//   schedule = "wsd" | "cosine" | "constant", warmup_steps, min_lr_ratio, decay_fraction
//
//   [[stages]]
//   name = "ctx256", seq_len = 256, tokens = 2_000_000, lr_scale = 1.0
//
// Every stage's seq_len must divide tokens_per_step and micro_batch_tokens (whole rows) and not
// exceed the model's max_seq_len ([model] of the model file); a stage's token budget must be at
// least one step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/run_config.h"
#include "core/status.h"
#include "learner/adamw.h"
#include "learner/lr_schedule.h"
#include "model/config.h"

namespace orrery {

struct StageConfig {
  std::string name;
  int64_t seq_len = 0;
  int64_t tokens = 0;     // token budget (input positions, padding included)
  double lr_scale = 1.0;  // multiplies the schedule's learning rate during this stage

  int64_t steps(int64_t tokens_per_step) const {
    return (tokens + tokens_per_step - 1) / tokens_per_step;
  }
};

struct PretrainConfig {
  RunConfig run;
  std::string model_path;
  model::ModelConfig model;
  std::string data_dir;
  int64_t tokens_per_step = 16384;
  int64_t micro_batch_tokens = 4096;
  int64_t eval_every = 20;
  int64_t eval_tokens = 16384;
  int64_t checkpoint_every = 50;
  int64_t keep_checkpoints = 3;
  // [run] device = "cuda" only: re-run each layer's forward in the backward instead of keeping its
  // activations (model/gpu/gpu_model.h GpuModelOptions::recompute_layers).
  bool recompute_layers = false;
  AdamWOptions adamw;
  double clip_grad_norm = 1.0;
  LrScheduleOptions schedule;  // total_steps is the sum over stages
  std::vector<StageConfig> stages;

  int64_t total_steps() const;
};

// Reads [run], [pretrain], [optimizer] and [[stages]] from the root table. Errors are recorded in
// the document (the caller runs Finish()).
PretrainConfig ReadPretrainConfig(ConfigTable& root);
// Parses the file, reads it and runs Finish(): the one-line error of any problem.
StatusOr<PretrainConfig> LoadPretrainConfig(const std::string& path);

}  // namespace orrery
