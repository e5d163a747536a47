// What the trainer needs from a model: parameters with gradients, a loss forward/backward over a
// packed batch, evaluation, load balancing after each optimizer step, and the non-parameter state
// a checkpoint must carry (Quantile Balancing biases). The hybrid model implements it in
// learner/hybrid_trainable.h; RL reuses the trainer with its own loss through the same interface.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "learner/packer.h"
#include "learner/param_ref.h"

namespace orrery {

struct LossSum {
  double loss_sum = 0;  // summed token cross-entropy (nats)
  int64_t tokens = 0;   // positions with a target
};

// Load of one MoE layer after the latest balancing update.
struct ExpertLoadReport {
  std::vector<double> load;  // tokens routed to each expert / target load q
  double max_violation = 0;  // max_j load_j - 1
};

class TrainableModel {
 public:
  virtual ~TrainableModel() = default;

  virtual std::vector<ParamRef> Parameters() = 0;
  // Named tensors that are state but not trained (balancing biases); saved in checkpoints.
  virtual std::vector<std::pair<std::string, Tensor>> Buffers() = 0;
  // The longest sequence the model accepts (0: unlimited).
  virtual int64_t max_seq_len() const = 0;

  // Adds grad_scale * d(loss_sum)/d(theta) to every ParamRef::grad and returns the loss sum over
  // the batch's targets. Router statistics for balancing accumulate until UpdateBalancing.
  virtual StatusOr<LossSum> ForwardBackward(const PackedBatch& batch, double grad_scale) = 0;
  // Loss only; touches neither gradients nor balancing statistics.
  virtual StatusOr<LossSum> Evaluate(const PackedBatch& batch) = 0;
  // Once per optimizer step: updates balancing biases from the statistics gathered since the
  // last call (all micro-batches of the step) and reports the load per MoE layer.
  virtual StatusOr<std::vector<ExpertLoadReport>> UpdateBalancing() = 0;
  // Called after the trainer wrote the parameters' values directly (a checkpoint restore), for
  // models that keep derived copies of them (the GPU model's bf16 weights).
  virtual Status ParametersLoaded() { return Status::OK(); }
};

}  // namespace orrery
