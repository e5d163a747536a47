// The pretraining loop: staged curriculum over packed token shards, gradient accumulation,
// AdamW with global-norm clipping and a schedule, balancing updates every step, held-out
// evaluation, metrics and checkpoints. The step itself (TrainStep) is separate so RL can reuse
// the optimizer, clipping and balancing logic with its own loss.
//
// Stage transitions: when a stage's token budget is spent the next stage starts with rows of its
// own length; the data cursor, optimizer state and schedule continue (the schedule runs over the
// whole run's steps, scaled by each stage's lr_scale). Each transition is logged and recorded in
// metrics.jsonl.
//
// Determinism: the packing order is a function of (seed, epoch), the optimizer is element-wise,
// and checkpoints hold the cursor, optimizer moments and balancing biases, so a resumed run
// reproduces the losses of an uninterrupted one exactly when the model's kernels are
// deterministic (the CPU and GPU kernels are: docs/pretraining.md, "Determinism").
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/metrics.h"
#include "core/status.h"
#include "learner/adamw.h"
#include "learner/checkpoint.h"
#include "learner/packer.h"
#include "learner/pretrain_config.h"
#include "learner/token_shards.h"
#include "learner/trainable_model.h"

namespace orrery {

// Result of one optimizer step.
struct StepResult {
  double loss = 0;  // mean over the step's targets
  int64_t targets = 0;
  double grad_norm = 0;  // before clipping
  double lr = 0;
  std::vector<ExpertLoadReport> balance;
};

// One optimizer step over `micro_batches`: forward/backward each (gradients scaled so they sum to
// the gradient of the mean loss over all targets), one balancing update, clipping, AdamW.
StatusOr<StepResult> TrainStep(TrainableModel& model, AdamW& optimizer,
                               const std::vector<PackedBatch>& micro_batches, double lr,
                               double clip_grad_norm);

struct PretrainerOptions {
  PretrainConfig config;
  std::string run_dir;
  int64_t max_steps = -1;  // stop (with a checkpoint) after this many steps in total; -1: all
  bool resume = false;     // continue from the newest checkpoint in run_dir
  bool show_progress = true;
  int32_t pad_id = 0;
  // Copied into every checkpoint (model.toml, tokenizer.json) so it is self-contained.
  std::map<std::string, std::string> checkpoint_files;
  // Also given every record after it is written to metrics.jsonl (e.g. the launcher's live
  // dashboard); called on the training thread, so it must not block.
  std::function<void(const MetricRecord&)> on_metric;
};

struct StageSummary {
  std::string name;
  int64_t seq_len = 0;
  int64_t steps = 0;
  double first_eval_loss = -1;  // -1: not evaluated
  double last_eval_loss = -1;
  double last_train_loss = -1;
};

struct PretrainSummary {
  int64_t steps = 0;
  int64_t tokens = 0;
  double seconds = 0;
  double tokens_per_second = 0;
  std::vector<StageSummary> stages;
  std::string last_checkpoint;
  bool finished = false;  // every stage's budget spent (not stopped by max_steps)
};

class Pretrainer {
 public:
  static StatusOr<std::unique_ptr<Pretrainer>> Create(PretrainerOptions options,
                                                      TrainableModel* model,
                                                      const TokenDataset* data);
  StatusOr<PretrainSummary> Run();
  // Held-out loss at `seq_len` over config.eval_tokens (a fixed set: same documents every time).
  StatusOr<double> Evaluate(int64_t seq_len);

 private:
  Pretrainer(PretrainerOptions options, TrainableModel* model, const TokenDataset* data,
             AdamW optimizer);
  Status Restore();
  StatusOr<std::string> SaveCheckpoint();
  // Writes `m` to metrics.jsonl, then hands it to options_.on_metric.
  Status Record(const MetricRecord& m);

  PretrainerOptions options_;
  TrainableModel* model_;
  const TokenDataset* data_;
  AdamW optimizer_;
  DocumentPacker train_packer_;
  std::vector<int64_t> heldout_docs_;
  TrainerState state_;
  std::unique_ptr<MetricsFileWriter> metrics_;
};

}  // namespace orrery
